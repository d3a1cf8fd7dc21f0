"""The learning rig (experiments/rig.py) on the real model, store and learner: what it samples is what
the serving weights would give, what it stores is what the learner trains on, and a segment's training
never reaches another segment."""

from __future__ import annotations

import torch

from liveloop.clients.rewards import make_reward
from liveloop.config import load_config
from liveloop.experiments.rig import Ask, LearningRig

ADAPTERS = 'extends = ["tuned_learner", "step_control"]\n[segments]\nadapters = "segment"\nnames = ["cozy", "night"]\n[learner]\n'
RESTART = "[learner.lora]\nrestart_window = 4\nrestart_drop = 0.5\n"  # a lane starts over when its 4-rating mean falls 0.5
PROMPTS = ["Tell me about cats.", "Say something about bread.", "Tell me about rain.", "Describe the moon."]


def _rig(tmp_path, model_dir, text: str) -> LearningRig:
    cfg = load_config(text=text)
    learner = cfg.learner.__class__(**{**cfg.learner.__dict__, "checkpoint_dir": str(tmp_path / "versions")})
    return LearningRig(tmp_path, model_dir, learner, cfg.critic, seed=3, segments=cfg.segments)


def test_batched_replies_carry_the_logprobs_a_full_forward_gives(tmp_path, model_dir):
    rig = _rig(tmp_path, model_dir, ADAPTERS)
    try:
        replies = rig.sample([Ask("cozy", "Tell me about cats."), Ask("cozy", "Describe the moon, please, in a few words.")])
        with rig.serving("cozy") as (model, lane, version):
            assert (lane, version) == ("cozy", 0)
            model.eval()
            for reply in replies:  # different prompt lengths: the shorter one was left-padded
                r = reply.rollout
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([r.prompt_ids + r.response_ids])).logits[0].float()
                lp = torch.log_softmax(logits, -1)
                start = len(r.prompt_ids) - 1
                expected = [float(lp[start + i, t]) for i, t in enumerate(r.response_ids)]
                assert max(abs(a - b) for a, b in zip(expected, r.logprobs)) < 1e-4
                assert r.text == rig.tokenizer.decode(r.response_ids, skip_special_tokens=True)
    finally:
        rig.close()


def test_every_rating_is_trained_once_by_its_segments_lane_and_the_other_lane_stays_the_base(tmp_path, model_dir):
    rig = _rig(tmp_path, model_dir, ADAPTERS)
    reward = make_reward("contains:behold")
    prompts = ["Tell me about cats.", "Say something about bread."] * 4
    try:
        night_before = rig.probe("night", prompts, reward, seed=7)
        rated = 0
        for _ in range(3):
            replies = rig.sample([Ask("cozy", p) for p in prompts[:4]])
            assert {r.lane for r in replies} == {"cozy"}
            rig.rate(replies, [reward(r.text) for r in replies])
            rated += len(replies)
            assert rig.train() == len(replies)  # batch size 1: one step per rating, none left behind
        cozy = rig.learner.lanes["cozy"]
        assert (cozy.state.samples, cozy.state.step) == (rated, rated)
        assert rig.learner.lanes["night"].state.samples == 0
        stored = rig.store.feedback.rated_after(0, 100, segment="cozy")
        assert len(stored) == rated and all(r.segment == "cozy" and r.request_meta == {"segment": "cozy"} for _, r in stored)
        assert rig.store.feedback.rated_after(0, 100, segment="night") == []
        # cozy's adapter moved; night's is still the base: the same prompts and sampling seed give the same replies
        lora_b = {n: p for n, p in rig.learner.adapters.model.named_parameters() if "lora_B" in n}
        assert any(p.abs().sum() > 0 for n, p in lora_b.items() if ".cozy." in n)  # a fresh adapter's B is 0
        assert all(p.abs().sum() == 0 for n, p in lora_b.items() if ".night." in n)
        assert rig.probe("night", prompts, reward, seed=7) == night_before
        with rig.serving(None) as (_, lane, _version):
            assert lane == "overflow"  # no segment: the shared overflow lane, as the server routes it
    finally:
        rig.close()


def test_the_whole_policy_serves_every_segment(tmp_path, model_dir):
    rig = _rig(tmp_path, model_dir, 'extends = ["tuned_learner", "step_control"]\n')
    try:
        with rig.serving("cozy") as (model, lane, _):
            assert lane is None and model is rig.learner.policy
        replies = rig.sample([Ask("night", "Tell me about rain.")])
        rig.rate(replies, [1.0])
        assert rig.train() == 1 and rig.learner.state.samples == 1
        (feedback, response), = rig.store.feedback.rated_after(0, 10)
        assert response.segment is None and feedback.reward == 1 and response.policy_version == 0
    finally:
        rig.close()


def test_a_lane_whose_ratings_collapse_starts_over_from_the_base_and_the_other_lane_keeps_its_adapter(tmp_path, model_dir):
    rig = _rig(tmp_path, model_dir, ADAPTERS + RESTART)

    def b_of(segment):
        return [p for n, p in rig.learner.adapters.model.named_parameters() if "lora_B" in n and f".{segment}." in n]

    def texts(segment):
        return [r.text for r in rig.sample([Ask(segment, p) for p in PROMPTS], torch.Generator().manual_seed(7))]

    try:
        cozy, night = rig.learner.lanes["cozy"], rig.learner.lanes["night"]
        # one step per rating: cozy's 4-rating mean goes 1.0 (best), 0.75, then 0.5 at its last rating
        for segment, rewards in (("night", [1, 1, 1, 1]), ("cozy", [1, 1, 1, 1]), ("cozy", [1, 1, 0, 0])):
            rig.rate(rig.sample([Ask(segment, p) for p in PROMPTS]), rewards)
            assert rig.train() == 4
            if segment == "night":
                night_learned = [p.detach().clone() for p in b_of("night")]
            if segment == "cozy" and cozy.restart.restarts == 0:
                assert any(p.abs().sum() > 0 for p in b_of("cozy"))  # learned before it fell
        assert (cozy.restart.restarts, night.restart.restarts) == (1, 0)
        assert cozy.state.last_metrics["learner/restarts"] == 1.0
        # started over: B = 0 again, so cozy serves exactly what the base (a lane never trained) serves;
        # its rate starts again; night keeps what it learned
        assert all(p.abs().sum() == 0 for p in b_of("cozy"))
        assert texts("cozy") == texts(None)
        assert cozy.learning_rate == cozy.config.learning_rate
        # night's adapter is exactly what its own 4 ratings made it (whether 4 small steps change a sampled
        # token is chance; the weights are not)
        assert any(p.abs().sum() > 0 for p in night_learned)
        assert all(torch.equal(a, b) for a, b in zip(b_of("night"), night_learned, strict=True))
        # and the fresh adapter learns: the optimizer holds its parameters
        rig.rate(rig.sample([Ask("cozy", PROMPTS[0])]), [1])
        assert rig.train() == 1 and any(p.abs().sum() > 0 for p in b_of("cozy"))
        assert cozy.state.samples == 9 and cozy.restart.restarts == 1
    finally:
        rig.close()


def test_one_keys_flood_of_down_votes_cannot_start_an_adapter_over(tmp_path, model_dir):
    """The restart reads the ratings its lane trained on, after the influence caps: one key's flood of
    down-votes (8, with one trained per key in the window) leaves cozy's learned adapter in place; the
    same 8 down-votes from 8 different users start it over."""
    caps = "max_per_key_per_window = 1\ninfluence_window_seconds = 3600.0\n"
    rig = _rig(tmp_path, model_dir, ADAPTERS + caps + RESTART)
    try:
        cozy = rig.learner.lanes["cozy"]
        rig.rate(rig.sample([Ask("cozy", p) for p in PROMPTS]), [1, 1, 1, 1])  # 4 users: the best window, 1.0
        assert rig.train() == 4
        rig.rate(rig.sample([Ask("cozy", p) for p in PROMPTS * 2]), [0] * 8, user="mallory")
        rig.train()
        assert (cozy.state.samples, cozy.restart.restarts, cozy.restart.window_mean) == (5, 0, 0.75)
        rig.rate(rig.sample([Ask("cozy", p) for p in PROMPTS * 2]), [0] * 8)  # 8 users in turn
        rig.train()
        assert cozy.restart.restarts == 1
    finally:
        rig.close()


def test_restart_critic_sends_the_critic_back_to_its_start(tmp_path, model_dir):
    """`restart_critic` (a lever measured and not shipped): on a restart the lane's critic is rebuilt from
    its start (here cold, on the base's trunk: no critic was pre-trained), not carried on."""
    rig = _rig(tmp_path, model_dir, ADAPTERS + RESTART + "restart_critic = true\n")

    def trunk(critic):
        return {n: p.detach().clone() for n, p in critic.model.named_parameters() if "score" not in n}

    try:
        cozy = rig.learner.lanes["cozy"]
        start = trunk(cozy.critic)
        rig.rate(rig.sample([Ask("cozy", p) for p in PROMPTS]), [1, 1, 1, 1])
        rig.train()
        trained = trunk(cozy.critic)
        assert any(not torch.equal(trained[n], p) for n, p in start.items())  # the critic learned
        rig.rate(rig.sample([Ask("cozy", p) for p in PROMPTS]), [1, 1, 0, 0])
        rig.train()
        assert cozy.restart.restarts == 1
        assert all(torch.equal(p, start[n]) for n, p in trunk(cozy.critic).items())
    finally:
        rig.close()
