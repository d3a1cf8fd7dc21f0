"""The agent experiment's plumbing, short, on the default model (the agent model's build takes minutes:
`liveloop experiment agent` builds it): every method runs its episodes through the real store and
learner, each stored episode's turns linked by the store, and the report has a row per method; an
unknown method is refused by name."""

from __future__ import annotations

import pytest

from liveloop.experiments.agent import AgentRun, report, summarize
from liveloop.experiments.agent_config import load_agent_experiment, with_overrides

CFG = with_overrides(load_agent_experiment(), episodes=16, batch=8, probe=8, probe_every=8, max_tokens=24, group_size=4)


@pytest.mark.parametrize("method", ["sao", "sao_obs_actions", "grpo"])
def test_a_short_run_stores_linked_episodes_and_measures_them(method, tmp_path, model_dir):
    run = AgentRun(CFG, method, 0, tmp_path / method, model_dir)
    try:
        out = run.run()
        store = run.rig.store
        seconds = [r for r in store.feedback.rated_after(0, 100)]
        assert len(seconds) == CFG.episodes
        for _, r in seconds:  # a rated turn is an episode's last: a first turn, or a second linked to its first exactly
            assert r.parent_id is None or (r.turn == 1 and r.prefix_tokens is not None)
    finally:
        run.close()
    assert out["episodes"] == CFG.episodes and 0 <= out["final_accuracy"] <= 1 and out["learner_steps"] > 0
    assert [n for n, _ in out["curve"]] == [0, 8, 16]
    text = report(summarize([out], CFG), CFG)
    assert f"| {method} |" in text
