"""The learner's logits at the response positions only (`policy_log_dists`): the same log-distributions
and the same gradients as the whole sequence's logits, on the real tiny model with prompts of different
lengths, and a clear refusal of logits that miss a response position."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from liveloop.rl.batch import Sample, make_batch, policy_log_dists, response_log_dists, token_logprobs


def _sample(prompt: int, response: int, offset: int) -> Sample:
    n = response
    return Sample(np.arange(3, 3 + prompt), np.arange(40 + offset, 40 + offset + n), np.full(n, -1.0, np.float32),
                  np.ones(n, np.uint8), 1.0, 0, "k")


@pytest.fixture(scope="module")
def model(model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_kept_positions_are_the_shortest_prompts_last_token_on():
    batch = make_batch([_sample(7, 4, 0), _sample(3, 2, 5), _sample(5, 6, 9)])
    # L = max(7 + 4, 3 + 2, 5 + 6) = 11; the shortest prompt (3) scores its first response token from position 2
    assert batch.input_ids.shape[1] == 11
    assert batch.scored_positions == 11 - 3 + 1


def test_the_kept_logits_give_the_whole_sequences_distributions_and_gradients(model):
    batch = make_batch([_sample(9, 4, 0), _sample(3, 6, 5), _sample(6, 1, 9)])
    whole = response_log_dists(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch)
    kept = policy_log_dists(model, batch)
    assert kept.shape == whole.shape == (3, 6, model.config.vocab_size)
    torch.testing.assert_close(kept, whole, rtol=0, atol=1e-5)

    def grads(dists: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        (token_logprobs(dists, batch) * batch.action_mask).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    g_whole = grads(response_log_dists(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch))
    g_kept = grads(policy_log_dists(model, batch))
    assert len(g_kept) == len(g_whole) > 0
    for a, b in zip(g_kept, g_whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_logits_that_miss_a_response_position_are_refused():
    batch = make_batch([_sample(4, 3, 0), _sample(2, 3, 1)])
    logits = torch.zeros(2, batch.scored_positions - 1, 8)
    with pytest.raises(ValueError, match="miss response positions"):
        response_log_dists(logits, batch)
    assert response_log_dists(torch.zeros(2, batch.scored_positions, 8), batch).shape == (2, 3, 8)
