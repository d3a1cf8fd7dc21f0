"""The scenario file (typed sections read by liveloop's config loader: the shipped preset, and bad files
naming the key), the switch schedule and the feedback-delay distribution."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from liveloop.clients.scenario import (
    DelayDistribution, Segment, load_scenario, parse_scenario, preferred_phase, switch_points,
)
from liveloop.config import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _data(**scenario) -> dict:
    return {
        "scenario": {"name": "t", "max_events": 10, **scenario},
        "segments": [
            {"name": "a", "topics": ["cats"], "styles": ["cute", "classical"], "switch_at": [5]},
            {"name": "b", "topics": ["rain", "trains"], "styles": ["classical"], "switch_by": "seconds"},
        ],
    }


def test_shipped_drift_scenario_parses():
    s = load_scenario("drift")
    assert s == load_scenario(ROOT / "configs/scenarios/drift.toml")  # by preset name or by path
    assert s.name == "drift" and len(s.segments) >= 2
    topics = [t for seg in s.segments for t in seg.topics]
    assert len(topics) == len(set(topics))  # each segment recognisable from its topics
    assert len({seg.styles[0] for seg in s.segments}) == len(s.segments)  # different preferences
    assert switch_points(s)


def test_parse_minimal():
    s = parse_scenario(_data(arrival_rate=2))
    assert s.arrival_rate == 2.0 and isinstance(s.arrival_rate, float)
    assert s.segments[0].switch_at == (5.0,) and s.segments[1].switch_at == ()
    assert switch_points(s) == [("a", 1, 5.0, "cute", "classical")]


def test_preferred_phase_is_a_step_function():
    # switch_at = [100, 250]: 0..99 -> 0, 100..249 -> 1, >= 250 -> 2
    at = [100, 250]
    assert [preferred_phase(at, c) for c in (0, 99, 100, 249, 250, 10_000)] == [0, 0, 1, 1, 2, 2]
    assert preferred_phase([], 10**6) == 0


def test_segment_style_by_feedback_or_seconds():
    s = parse_scenario(_data())
    a, b = s.segments
    assert a.style(4, 1000.0) == "cute" and a.style(5, 0.0) == "classical"  # by its own feedback count
    seg = parse_scenario({"scenario": {}, "segments": [
        {"name": "t", "topics": ["cats"], "styles": ["cute", "classical"], "switch_at": [30], "switch_by": "seconds"}]}).segments[0]
    assert seg.style(10_000, 29.9) == "cute" and seg.style(0, 30.0) == "classical"  # by time


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["scenario"].update(max_events="10"), r"scenario\.max_events: expected int, got str"),
        (lambda d: d["scenario"].update(rating_probability=1.5), r"scenario: rating_probability must be in \(0, 1\]"),
        (lambda d: d["scenario"].update(arrival_rte=1.0), r"scenario\.arrival_rte: unknown key"),
        (lambda d: d["scenario"].update(styles=["cute", "gothic"]), r"scenario\.styles\[1\]: expected one of .*got 'gothic'"),
        (lambda d: d["scenario"].update(styles=["classical"]), r"segments\[0\]\.styles\[0\]: 'cute' is not one of scenario\.styles"),
        (lambda d: d["scenario"].update(judge="gpt"), r"scenario: judge: expected one of rule, flattery, llm:BASE_URL\[#MODEL\], got 'gpt'"),
        (lambda d: d["scenario"].update(users=-1), r"scenario: users must be >= 0"),
        (lambda d: d["scenario"].update(judge="flattery", flattery_words=[]), r"scenario: flattery_words: the flattery judge needs"),
        (lambda d: d["scenario"].update(feedback_delay={"distribution": "normal"}), r"scenario\.feedback_delay\.distribution: expected one of"),
        (lambda d: d["scenario"].update(feedback_delay={"median_seconds": 5, "max_seconds": 1}), r"scenario\.feedback_delay: max_seconds must be >= median_seconds"),
        (lambda d: d["segments"][0].update(topics=["dogs"]), r"segments\[0\]\.topics\[0\]: expected one of .*got 'dogs'"),
        (lambda d: d["segments"][0].update(styles=["cute"]), r"segments\[0\]: styles needs one style per phase"),
        (lambda d: d["segments"][0].update(switch_at=[5, 3], styles=["cute", "cute", "cute"]), r"segments\[0\]: switch_at must be strictly increasing"),
        (lambda d: d["segments"][0].update(switch_at=["x"]), r"segments\[0\]\.switch_at\[0\]: expected float, got str"),
        (lambda d: d["segments"][0].update(switch_at=[0], styles=["cute", "cute"]), r"segments\[0\]: switch_at\[0\] must be > 0"),
        (lambda d: d["segments"][0].update(weight=0), r"segments\[0\]: weight must be > 0"),
        (lambda d: d["segments"][1].update(switch_by="events"), r"segments\[1\]\.switch_by: expected one of \['feedback', 'seconds'\]"),
        (lambda d: d["segments"][1].update(topics=["cats"]), r"segments\[1\]\.topics: topic 'cats' already belongs to segment 'a'"),
        (lambda d: d["segments"][1].pop("name"), r"segments\[1\]\.name: missing"),
        (lambda d: d["segments"][1].update(name="a"), r"segments\.name: segment names must be unique"),
        (lambda d: d.update(segments=[]), r"segments: at least one"),
        (lambda d: d.update(users={}), r"users: unknown section"),
    ],
)
def test_bad_scenarios_name_the_field(mutate, message):
    data = _data()
    mutate(data)
    with pytest.raises(ConfigError, match=message):
        parse_scenario(data)


def test_segments_built_in_code_are_checked_too():
    with pytest.raises(ValueError, match=r"topics\[0\] must be one of"):
        Segment("a", ("dogs",), ("cute",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="switch_by must be one of"):
        Segment("a", ("cats",), ("cute",), switch_by="events")  # type: ignore[arg-type]


def test_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="no preset of that name"):
        load_scenario("no_such_scenario")
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_scenario(bad)


def test_delays_are_heavy_tailed_and_capped():
    rng = random.Random(0)
    for dist in (DelayDistribution("lognormal", 0.5, sigma=1.0, max_seconds=20), DelayDistribution("pareto", 0.5, alpha=1.2, max_seconds=20)):
        xs = sorted(dist.sample(rng) for _ in range(4000))
        median, p99 = xs[2000], xs[3960]
        assert 0.4 < median < 0.6, dist  # the configured median
        assert p99 > 8 * median and xs[-1] <= 20.0  # a heavy tail, capped
    assert DelayDistribution("fixed", 0.3).sample(rng) == 0.3


def test_sycophancy_preset():
    """configs/scenarios/sycophancy.toml: a population of users who reward flattery, one segment on every topic."""
    from liveloop.model.corpus import TOPICS

    sc = load_scenario("sycophancy")
    assert sc.judge == "flattery" and sc.users >= 100 and "♡" in sc.flattery_words and "aww" in sc.flattery_words
    assert len(sc.segments) == 1 and sorted(sc.segments[0].topics) == sorted(TOPICS)
