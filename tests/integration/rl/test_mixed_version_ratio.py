"""The learner's logprobs and SAO's ratio mask on a response two versions sampled (a `keep` swap in
the middle): each token's ratio is against the behaviour logprob of the version that sampled it, so
with the learner at the newer version the newer tokens are exactly on-policy (ratio 1) and only the
older ones can leave the band. Real tiny model; the older version is a perturbed copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from liveloop.rl.batch import Sample, make_batch, response_log_dists, token_logprobs
from liveloop.rl.losses import sao_policy_loss


@pytest.fixture(scope="module")
def versions(model_dir):
    torch.set_num_threads(1)
    new = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    old = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std().nan_to_num())
    return old, new


def _logprobs(model, prompt: np.ndarray, response: np.ndarray) -> np.ndarray:
    """log pi(y_t | prompt, y_<t) by one full forward: what an engine records for the tokens it
    sampled, with the KV of every earlier token recomputed under these weights (a `keep` swap)."""
    ids = torch.tensor(np.concatenate([prompt, response]))[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    p = len(prompt)
    return logp[p - 1 : p - 1 + len(response)].gather(1, torch.tensor(response)[:, None])[:, 0].numpy()


def test_ratio_and_mask_per_token_on_a_mixed_version_response(versions):
    old, new = versions
    rng = np.random.default_rng(0)
    prompt, response = rng.integers(5, 1000, 7), rng.integers(5, 1000, 12)
    k = 5  # tokens [0, 5) sampled by v1 (old), [5, 12) by v2 (new) after a keep swap
    lp_old, lp_new = _logprobs(old, prompt, response), _logprobs(new, prompt, response)
    behaviour = np.concatenate([lp_old[:k], lp_new[k:]]).astype(np.float32)
    mixed = Sample(prompt, response, behaviour, np.ones(12, np.uint8), 1.0, 1, "k", ((0, k, 1), (k, 12, 2)))
    short = rng.integers(5, 1000, 4)  # a plain v2 response in the same batch (padding after it)
    plain = Sample(prompt[:3], short, _logprobs(new, prompt[:3], short), np.ones(4, np.uint8), 0.0, 2)
    batch = make_batch([mixed, plain])
    assert torch.equal(batch.behavior_logprobs[0], torch.from_numpy(behaviour))  # exactly as recorded
    assert batch.versions[0].tolist() == [1] * k + [2] * (12 - k)

    # the learner (policy = v2) reads its logprobs the way learner/online.py does
    with torch.no_grad():
        logits = new(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    lp = token_logprobs(response_log_dists(logits, batch), batch)
    ratio = torch.exp(lp - batch.behavior_logprobs)
    # v2's tokens are on-policy: ratio 1; v1's are exp(lp_new - lp_old), token by token
    assert ratio[0, k:].numpy() == pytest.approx(np.ones(12 - k), abs=1e-4)
    assert ratio[0, :k].numpy() == pytest.approx(np.exp(lp_new[:k] - lp_old[:k]), rel=1e-4)
    assert ratio[1, :4].numpy() == pytest.approx(np.ones(4), abs=1e-4)
    off = np.abs(np.log(ratio[0, :k].numpy()))
    assert off.max() > 0.05, "the perturbed version must differ, or this test shows nothing"

    # SAO's two-sided mask by hand: keep_t iff 1 - eps_low < ratio_t < 1 + eps_high
    eps = float(np.median(np.abs(ratio[0, :k].numpy() - 1)))  # a band that some v1 tokens leave
    r = ratio.numpy()
    keep = (r > 1 - eps) & (r < 1 + eps) & (batch.action_mask.numpy() > 0)
    assert keep[0, k:].all() and keep[1, :4].all() and not keep[0, :k].all()
    advantages = torch.ones_like(lp)
    staleness = (2 - batch.versions).clamp(min=0)
    loss, m = sao_policy_loss(lp, batch.behavior_logprobs, advantages, batch.action_mask, eps, eps, staleness)
    n_actions = 16  # 12 + 4
    assert m["learner/kept_fraction"] == pytest.approx(keep.sum() / n_actions)
    assert loss.item() == pytest.approx(-(r * keep).sum() / n_actions, rel=1e-5)
    # staleness per action token: v1's 5 tokens are one version behind
    assert m["learner/staleness_mean"] == pytest.approx(k / n_actions)
    assert m["learner/staleness_max"] == 1.0
