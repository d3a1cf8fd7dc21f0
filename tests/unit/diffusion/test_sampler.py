"""The LLaDA sampler: never leaves a mask, commits block by block, the most confident first, and is
deterministic under a seed."""

from __future__ import annotations

import pytest
import torch

from liveloop.diffusion.model import TinyModelConfig, tiny_model
from liveloop.diffusion.sampler import SamplerConfig, generate, pad_to_length, transfer_schedule, truncate_at_eos
from liveloop.diffusion.tokenizer import build_tokenizer

MASK, EOS, V = 2, 1, 10


class FakeModel:
    """Logits favour token (position % 5) + 5 at every position, more strongly further right, and put a
    huge logit on the MASK token (which the sampler must never pick). Records every input it sees."""

    mask_id, eos_id, pad_id = MASK, EOS, 0

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def __call__(self, x):
        self.seen.append(x.clone())
        b, t = x.shape
        logits = torch.zeros(b, t, V)
        pos = torch.arange(t)
        logits[:, pos, pos % 5 + 5] = 1.0 + pos.float()  # confidence rises with position
        logits[..., MASK] = 100.0
        return logits


def test_transfer_schedule():
    assert transfer_schedule(8, 3) == [3, 3, 2]  # 8 = 3 + 3 + 2, remainder first
    assert transfer_schedule(4, 4) == [1, 1, 1, 1]
    assert transfer_schedule(2, 4) == [1, 1, 0, 0]


def test_never_leaves_a_mask_and_respects_blocks():
    model = FakeModel()
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.0)  # 2 blocks, 2 steps each
    prompt = torch.tensor([[7, 8, 9]])
    out = generate(model, prompt, cfg)
    assert (out.response_ids != MASK).all()
    # greedy: each position gets its favourite token (p % 5) + 5, p the absolute position
    assert out.response_ids[0].tolist() == [(p % 5) + 5 for p in range(3, 11)]
    # 4 forward passes; nothing of block 2 (positions 7..10) is committed while block 1 is decoded
    assert len(model.seen) == 4
    for step, x in enumerate(model.seen):
        if step < 2:
            assert (x[0, 7:] == MASK).all()
    # 2 commits per step, the most confident (rightmost) of the block first
    assert out.commit_step[0].tolist() == [1, 1, 0, 0, 3, 3, 2, 2]
    assert (out.commit_logprobs <= 0).all()


def test_deterministic_under_a_seed_and_varies_across_seeds():
    tok = build_tokenizer()
    model = tiny_model(TinyModelConfig(), tok, seed=0).eval()
    prompt = torch.tensor([tok.encode("countdown 3 5 7 = 22\n", add_special_tokens=False)] * 2)
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=1.0)
    a = generate(model, prompt, cfg, torch.Generator().manual_seed(1))
    b = generate(model, prompt, cfg, torch.Generator().manual_seed(1))
    c = generate(model, prompt, cfg, torch.Generator().manual_seed(2))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.commit_logprobs, b.commit_logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    assert (a.response_ids != tok.mask_token_id).all()
    assert (a.commit_step >= 0).all()  # every position committed by the schedule itself


def test_config_validation_and_eos_helpers():
    with pytest.raises(ValueError, match="multiple of block_length"):
        SamplerConfig(gen_length=10, block_length=4)
    with pytest.raises(ValueError, match="number of blocks"):
        SamplerConfig(gen_length=8, block_length=4, steps=3)
    assert truncate_at_eos([5, 6, EOS, EOS], EOS) == [5, 6, EOS]
    assert pad_to_length([5, 6, EOS], 5, EOS) == [5, 6, EOS, EOS, EOS]
