"""The drift scenario, short form, with per-segment adapters: the drift experiment's own code path
(`run_drift`) on configs/experiments/drift_long.toml's scenario cut to 260 feedback events (switches at each
segment's 60th and 70th), the `sao_adapters` method on the hf engine. The long run (1,200 events,
five methods, two seeds) is a benchmark; this one checks that each segment is served only by its own
adapter lineage, that both lanes learn and publish, and that the report is written."""

from __future__ import annotations

import dataclasses
import json

import pytest

from liveloop.clients.simulator import read_events
from liveloop.experiments.drift import load_experiment, run_drift

EVENTS = 260


@pytest.mark.slow
def test_each_segment_is_served_by_its_own_adapter_lineage(tmp_path, model_dir):
    cfg = load_experiment("drift_long", only=["sao_adapters"])
    segments = tuple(dataclasses.replace(s, switch_at=(at,)) for s, at in zip(cfg.scenario.segments, (60, 70)))
    cfg = dataclasses.replace(
        cfg, scenario=dataclasses.replace(cfg.scenario, max_events=EVENTS, segments=segments), pretrain_rollouts=64,
    )
    out = run_drift(cfg, tmp_path / "results", progress=False, model_dir=model_dir)
    results = json.loads((out / "results.json").read_text())
    assert results["methods"][0]["error"] is None
    for name in ("summary.md", "reward_vs_events.png", "events-sao_adapters.jsonl", "run-sao_adapters.json"):
        assert (out / name).stat().st_size > 0, name
    run = json.loads((out / "learner-sao_adapters.json").read_text())
    lineage = {v["version"]: v["segment"] for v in run["versions"]}
    assert {s for s in lineage.values() if s} == {"cozy", "night"}, lineage  # both lanes published
    events = [e for e in read_events(out / "events-sao_adapters.jsonl") if e.rated]
    for e in events:  # served by the base (version 0) or an adapter of its own segment, never another's
        assert e.policy_version == 0 or lineage.get(e.policy_version) == e.segment, (e.segment, e.policy_version)
    lanes = run["learner"]["segments"]
    for segment in ("cozy", "night"):
        rated = sum(e.segment == segment for e in events)
        assert 0 < lanes[segment]["samples"] <= rated, (segment, lanes[segment]["samples"], rated)
    assert lanes["overflow"]["samples"] == 0
