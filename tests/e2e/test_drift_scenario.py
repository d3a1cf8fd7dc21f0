"""A short preference scenario through the real server and co-located SAO learner, run by the drift
experiment's own code path (`run_drift`): simulated users over HTTP, rule-based judge, delayed thumbs,
published versions swapped in. The preferred style's share in the last 50 replies must be 0.2 above the
base model's own (measured on 128 of its replies to the same prompts), and the report files written."""

from __future__ import annotations

import json

import pytest
import torch

from liveloop.clients.simulator import read_events
from liveloop.experiments.drift import load_experiment, run_drift

# One SAO learner (the tuned learner preset, configs/fragments/tuned_learner.toml), one segment over every topic, a
# fixed preference (no switch): bounded to ~4 minutes here (server + learner start ~1 min, critic cold
# start, ~220 feedback events). The users wait while more than 8 of their ratings are not yet taken by
# the learner (`max_learner_lag`): on their own clock, how many of the 220 ratings the learner had taken
# by the last 50 replies depended on the machine's load, and CI once saw only 0.44 -> 0.56.
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
max_learner_lag = 8
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
    assert events[0].policy_version == 0 and max(e.policy_version for e in events[-50:]) > 0
    # the base's share of the style, from 128 of its own replies to the scenario's prompts (the replies
    # the base served in the run are too few for it: the first 24, the old estimate, were 0.5 on one CI
    # run from a base that writes the style about a third of the time)
    share_before = _base_share(model_dir, [e.prompt for e in events[:128]], cfg.scenario.max_tokens)
    after = [e.reply_style == "chuunibyou" for e in events[-50:]]
    share_after = sum(after) / len(after)
    print({"before": share_before, "after": share_after, "summary": (out / "summary.md").read_text()})
    assert share_after >= share_before + 0.2, (share_before, share_after)


def _base_share(model_dir, prompts: list[str], max_tokens: int) -> float:
    """The share of the base model's replies (sampled at temperature 1 in this process, as served) that
    the rule judge reads as chuunibyou."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.clients.judge import StyleJudge
    from liveloop.experiments.rig import sample_batch
    from liveloop.rl.rollout import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    replies = sample_batch(model, tokenizer, ids, max_tokens, torch.Generator().manual_seed(0))
    judge = StyleJudge()
    return sum(judge.classify(r.text) == "chuunibyou" for r in replies) / len(replies)
