"""A sample drawn under a shaped distribution (temperature, min-p/top-k/top-p) is scored through the same
shaping (`response_log_dists` with `TokenBatch.draws`): by hand on logits whose draw is known, on the real
tiny model where tokens drawn from the shaped distribution score their own behaviour logprobs exactly
(ratio 1 on-policy), per turn in an episode's spans; and the draws the learner cannot replay are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from liveloop.rl.batch import Sample, Unscorable, make_batch, policy_log_dists, response_log_dists, scorable, token_logprobs
from liveloop.sampling import Sampling, draw_logits


def _sample(n: int, sampling: Sampling | None = None, spans: tuple = (), response=None, logprobs=None) -> Sample:
    resp = np.arange(5, 5 + n) if response is None else np.asarray(response)
    blp = np.full(n, -1.0, np.float32) if logprobs is None else np.asarray(logprobs, np.float32)
    return Sample(np.array([1, 2, 3]), resp, blp, np.ones(n, np.uint8), 1.0, 0, "k", sampling=sampling, sampling_spans=spans)


def test_by_hand_temperature_and_nucleus():
    # one response token, scored from the prompt's last position: logits log(0.5, 0.3, 0.15, 0.05) there
    logits = torch.zeros(1, 4, 4)
    logits[0, 2] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    s = Sampling(temperature=2.0, top_p=0.5)
    batch = make_batch([_sample(1, s, response=[1])])
    # the distribution: tempered, uncut (what KL terms compare): p ~ sqrt(p) = 0.379, 0.294, 0.208, 0.120
    r = np.sqrt([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(response_log_dists(logits, batch)[0, 0].numpy(), np.log(r / r.sum()), atol=1e-6)
    # the drawn token's score: under the nucleus of 0.5, which keeps the first two
    score = token_logprobs(response_log_dists(logits, batch), batch)[0, 0]
    assert float(score) == pytest.approx(np.log(r[1] / r[:2].sum()), abs=1e-6)
    # a drawn token outside the new nucleus (3) stays in: its score is finite
    out = make_batch([_sample(1, s, response=[3])])
    score = token_logprobs(response_log_dists(logits, out), out)[0, 0]
    assert float(score) == pytest.approx(np.log(r[3] / r[[0, 1, 3]].sum()), abs=1e-6)


def test_kl_terms_see_no_cut():
    """Two models whose nuclei differ compare finite, tempered distributions (a cut token would weigh 1e9)."""
    from liveloop.rl.diagnostics import token_kl

    a, b = torch.zeros(1, 4, 4), torch.zeros(1, 4, 4)
    a[0, 2] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    b[0, 2] = torch.log(torch.tensor([0.3, 0.5, 0.15, 0.05]))
    batch = make_batch([_sample(1, Sampling(temperature=1.0, top_p=0.4), response=[1])])
    kl = token_kl(response_log_dists(a, batch), response_log_dists(b, batch), batch.action_mask)
    p, q = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.3, 0.5, 0.15, 0.05])
    assert kl == pytest.approx(float((p * np.log(p / q)).sum()), abs=1e-5)


def test_plain_and_greedy_samples_carry_no_draws():
    batch = make_batch([_sample(2, Sampling()), _sample(2, Sampling(temperature=0.0, top_p=0.3)), _sample(2, None)])
    assert batch.draws == ()


@pytest.fixture(scope="module")
def model(model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _draw(model, prompt: list[int], n: int, s: Sampling, seed: int) -> tuple[list[int], list[float]]:
    """n tokens drawn from the model's shaped distribution, with their logprobs: a sampler beside the
    engines', written here from the definition."""
    gen = torch.Generator().manual_seed(seed)
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1:].float()
            lp = torch.log_softmax(draw_logits(logits, s), -1)[0]
            t = int(torch.multinomial(lp.exp(), 1, generator=gen))
            ids.append(t)
            lps.append(float(lp[t]))
    return ids[len(prompt):], lps


def test_on_policy_the_shaped_score_is_the_behaviour_logprob(model):
    prompt = [3, 17, 42, 9]
    samples = []
    for i, s in enumerate((Sampling(temperature=2.0, top_p=0.5), Sampling(temperature=0.7, top_k=5, min_p=0.05), Sampling())):
        resp, lps = _draw(model, prompt, 6, s, seed=i)
        samples.append(Sample(np.array(prompt), np.array(resp), np.array(lps, np.float32), np.ones(6, np.uint8), 1.0, 0, "k",
                              sampling=s))
    batch = make_batch(samples)
    with torch.no_grad():
        scored = token_logprobs(policy_log_dists(model, batch), batch)
    torch.testing.assert_close(scored, batch.behavior_logprobs, rtol=0, atol=1e-4)
    # unshaped, the tempered rows' scores are another distribution's: the ratio would be off
    plain = make_batch([Sample(s.prompt_ids, s.response_ids, s.behavior_logprobs, s.action_mask, 1.0, 0) for s in samples])
    with torch.no_grad():
        raw = token_logprobs(policy_log_dists(model, plain), plain)
    assert (raw[0] - batch.behavior_logprobs[0]).abs().max() > 0.05


def test_an_episodes_turns_are_shaped_by_their_own_draws(model):
    s = Sampling(temperature=1.5, top_p=0.6)
    prompt = [3, 17, 42, 9]
    first, lps = _draw(model, prompt, 4, s, seed=3)
    observation = [11, 12]
    spans = ((0, 4, s), (6, 8, Sampling(temperature=0.5)))
    second, lps2 = _draw(model, prompt + first + observation, 2, Sampling(temperature=0.5), seed=4)
    resp = first + observation + second
    blp = lps + [0.0, 0.0] + lps2
    mask = np.array([1, 1, 1, 1, 0, 0, 1, 1], np.uint8)
    sample = Sample(np.array(prompt), np.array(resp), np.array(blp, np.float32), mask, 1.0, 0, "k", sampling_spans=spans)
    batch = make_batch([scorable(sample, model.config.vocab_size)])
    with torch.no_grad():
        scored = token_logprobs(policy_log_dists(model, batch), batch)
    torch.testing.assert_close(scored * batch.action_mask, batch.behavior_logprobs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("sampling", [Sampling(repetition_penalty=1.1), Sampling(min_tokens=2),
                                      Sampling.logged_raw(0.7, 1.0), Sampling.logged_raw(1.0, 0.9)])
def test_draws_the_learner_cannot_replay_are_refused(sampling):
    with pytest.raises(Unscorable) as info:
        scorable(_sample(3, sampling), 1000)
    assert info.value.reason == "sampling"


def test_spans_outside_the_response_are_refused():
    with pytest.raises(Unscorable) as info:
        scorable(_sample(3, spans=((0, 5, Sampling(temperature=2.0)),)), 1000)
    assert info.value.reason == "lengths"


@pytest.mark.parametrize("sampling", [Sampling.logged_raw(1.0, 1.0), Sampling.logged_raw(0.0, 1.0), Sampling(temperature=0.3, top_p=0.2)])
def test_replayable_draws_pass(sampling):
    assert scorable(_sample(3, sampling), 1000).sampling == sampling
