"""A short preference scenario through the real server and co-located SAO learner, run by the drift
experiment's own code path (`run_drift`): simulated users over HTTP, rule-based judge, delayed thumbs,
published versions swapped in. The preferred style's share must rise after training, and the report
files must be written."""

from __future__ import annotations

import json

import pytest

from liveloop.clients.simulator import read_events
from liveloop.experiments.drift import load_experiment, run_drift

# One SAO learner (the tuned learner preset, configs/tuned_learner.toml), one segment over every topic, a
# fixed preference (no switch): bounded to ~3 minutes here (server + learner start ~1 min, critic cold
# start, ~220 feedback events).
CONFIG = """
extends = "tuned_learner"

[experiment]
methods = ["sao"]
readapt_window = 40
pretrain_rollouts = 64
pretrain_ev_threshold = 0.5
pretrain_max_epochs = 12
backend = "vllm"

[critic]
value_steps = 2

[methods.sao]

[scenario]
name = "e2e"
seed = 3
max_events = 220
arrival_rate = 4.0
max_in_flight = 6
rating_probability = 1.0
max_tokens = 48

[scenario.feedback_delay]
distribution = "lognormal"
median_seconds = 0.2
sigma = 0.8
max_seconds = 3.0

[[segments]]
name = "all"
topics = ["cats", "the sea", "rain", "bread", "the moon", "forests", "trains", "music"]
styles = ["chuunibyou"]
"""


@pytest.mark.slow
@pytest.mark.learning
def test_preferred_style_share_rises_and_report_is_written(tmp_path, model_dir):
    path = tmp_path / "e2e.toml"
    path.write_text(CONFIG)
    cfg = load_experiment(path)
    out = run_drift(cfg, tmp_path / "results", progress=False, model_dir=model_dir)
    for name in ("summary.md", "results.json", "reward_vs_events.png", "reward_vs_time.png", "events-sao.jsonl", "config.toml"):
        assert (out / name).stat().st_size > 0, name
    assert out.name.startswith("drift-") and out.name.endswith(cfg.digest)
    results = json.loads((out / "results.json").read_text())
    sao = results["methods"][0]
    assert sao["error"] is None and sao["versions_published"] > 0
    events = sorted(read_events(out / "events-sao.jsonl"), key=lambda e: e.t_reply)
    # every reply the base model served (version 0): how many depends on how fast the learner publishes,
    # at least the first 24 (the first 24 alone are a noisy estimate: CI once drew 12 of 24 in the style,
    # 0.5, from a base that writes each of its three styles about a third of the time, and the 0.68 after
    # fell short of +0.2)
    base = [e for e in events if e.policy_version == 0]
    before = [e.reply_style == "chuunibyou" for e in (base if len(base) >= 24 else events[:24])]
    after = [e.reply_style == "chuunibyou" for e in events[-50:]]
    share_before, share_after = sum(before) / len(before), sum(after) / len(after)
    print({"before": share_before, "n_before": len(before), "after": share_after, "summary": (out / "summary.md").read_text()})
    assert events[0].policy_version == 0 and max(e.policy_version for e in events[-50:]) > 0
    # base model: ~1/3 of replies in each style; require a clear rise
    assert share_after >= share_before + 0.2, (share_before, share_after)
