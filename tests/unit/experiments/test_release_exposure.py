"""The exposure experiment's summary across seeds: means with their intervals and the table, by hand."""

from __future__ import annotations

import pytest

from liveloop.experiments.release_exposure import ExposureRun, ExposureSettings, summarize, table


def _run(mode: str, seed: int, exposure: float, bad: tuple[int, ...] = (), held: tuple[int, ...] = ()) -> ExposureRun:
    return ExposureRun(
        mode=mode, seed=seed, seconds=100.0 + seed, bad=bad, held=held, failed=bad, exposure=exposure,
        exposed=frozenset(), users=frozenset({"user-0"}), flattery={1: 0.5}, flattery_base=0.3, reward_first=0.2,
        reward_last=0.8, served=(0, 1), versions=2, ratings=160,
    )


def test_summary_per_mode_counts_versions_and_keeps_mode_order():
    runs = [_run("gated", 0, 0.0, bad=(3,), held=(3,)), _run("immediate", 0, 1.0, bad=(1, 2, 3)), _run("immediate", 1, 0.8, bad=(2,))]
    s = summarize(runs)
    assert list(s) == ["immediate", "gated"]
    assert s["immediate"]["exposure"].mean == pytest.approx(0.9) and s["immediate"]["bad"].mean == 2.0
    assert s["immediate"]["held"].mean == 0.0 and s["gated"]["held"].n == 1
    text = table(s)
    lines = text.splitlines()
    assert lines[0].startswith("| mode | seeds | exposure") and len(lines) == 4
    assert lines[2].startswith("| immediate | 2 | 0.900 [") and lines[3].startswith("| gated | 1 | 0.000 |")


def test_a_run_row_is_json_with_user_counts():
    row = _run("canary", 2, 0.1, bad=(5,), held=(5,)).row()
    assert row["users"] == 1 and row["exposed"] == 0 and row["flattery"] == {"1": 0.5} and row["bad"] == (5,)


def test_settings_vary_the_scenario_and_release_by_seed():
    s = ExposureSettings(max_events=160)
    assert s.scenario(3).seed == 3 and s.scenario(3).max_events == 160 and s.scenario(3).users == 30
    assert 'mode = "gated"' in s.release_toml("gated", 3) and "seed = 3" in s.release_toml("gated", 3)
    assert "canary_fraction = 0.2" in s.release_toml("canary", 0) and "canary_fraction" not in s.release_toml("immediate", 0)
