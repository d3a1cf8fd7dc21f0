"""LLaDA-style generation from a masked diffusion LM (low-confidence remasking, semi-autoregressive
blocks). Owns the decode schedule; knows nothing about tokenizers, stores or serving.

The response (`gen_length` positions after the prompt) starts all MASK. Blocks of `block_length` are
decoded left to right, each in `steps / num_blocks` steps. At each step the model predicts every masked
position (Gumbel-max sampling at `temperature`, argmax at 0); of the current block's masked positions the
k most confident (probability of the chosen token under the raw, temperature-1 distribution) are
committed, the rest stay masked. k spreads the block's masks evenly over its steps (LLaDA's
`get_num_transfer_tokens`), so a block is complete when its steps are done; positions of later blocks are
never committed early. The mask token is never predicted; any mask left over becomes EOS. Every
committed token's logprob at commit time is recorded (a decode-time score, not a causal likelihood).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from liveloop.diffusion.config import SamplerConfig  # the setting lives in the torch-free config module
from liveloop.diffusion.model import MaskedDiffusionLM


@dataclass(frozen=True)
class SampleOutput:
    response_ids: Tensor  # [B, gen_length] long, no MASK left
    commit_logprobs: Tensor  # [B, gen_length] logprob of each token under the raw distribution when committed
    commit_step: Tensor  # [B, gen_length] step at which each position was committed (-1: leftover -> EOS)


def transfer_schedule(n_masked: int, steps: int) -> list[int]:
    """How many positions to commit at each of `steps` steps: n // steps each, the remainder first.
    E.g. 8 masks in 3 steps -> [3, 3, 2]."""
    base, extra = divmod(n_masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


@torch.no_grad()
def generate(model: MaskedDiffusionLM, prompt_ids: Tensor, cfg: SamplerConfig,
             generator: torch.Generator | None = None,
             on_block: Callable[[int, Tensor, Tensor], bool] | None = None) -> SampleOutput:
    """Sample `B` responses for `B` prompts of equal length (`prompt_ids` [B, P]).

    `on_block(b, response [B, (b + 1) * block_length], logprobs)` is called when block b is final (its
    tokens never change again): a server can stream them. Returning True stops early (e.g. after EOS);
    positions not decoded then are EOS."""
    bsz, plen = prompt_ids.shape
    x = torch.full((bsz, plen + cfg.gen_length), model.mask_id, dtype=torch.long, device=prompt_ids.device)
    x[:, :plen] = prompt_ids
    commit_lp = torch.zeros(bsz, cfg.gen_length, device=prompt_ids.device)
    commit_step = torch.full((bsz, cfg.gen_length), -1, dtype=torch.long, device=prompt_ids.device)
    num_blocks = cfg.gen_length // cfg.block_length
    steps_per_block = cfg.steps // num_blocks
    step = 0
    for b in range(num_blocks):
        start, end = plen + b * cfg.block_length, plen + (b + 1) * cfg.block_length
        schedule = [transfer_schedule(int(n), steps_per_block)
                    for n in (x[:, start:end] == model.mask_id).sum(dim=1)]
        for s in range(steps_per_block):
            masked = x == model.mask_id
            logits = model(x).float()
            logits[..., model.mask_id] = float("-inf")
            chosen = _sample(logits, cfg.temperature, generator)
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen_lp = logprobs.gather(-1, chosen[..., None])[..., 0]
            confidence = torch.where(masked, chosen_lp, torch.full_like(chosen_lp, float("-inf")))
            confidence[:, end:] = float("-inf")  # later blocks wait their turn
            confidence[:, :start] = float("-inf")
            for r in range(bsz):
                k = schedule[r][s]
                if k == 0:
                    continue
                idx = torch.topk(confidence[r], k).indices
                x[r, idx] = chosen[r, idx]
                commit_lp[r, idx - plen] = chosen_lp[r, idx]
                commit_step[r, idx - plen] = step
            step += 1
        if on_block is not None and on_block(b, x[:, plen:end].clone(), commit_lp[:, : end - plen].clone()):
            break
    response = x[:, plen:]
    response[response == model.mask_id] = model.eos_id
    return SampleOutput(response, commit_lp, commit_step)


def _sample(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """Gumbel-max: argmax(logits / T + Gumbel noise) samples softmax(logits / T); T = 0 is argmax."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(u.clamp(min=1e-20)))
    return (logits.double() / temperature + gumbel).argmax(dim=-1)


def truncate_at_eos(ids: list[int], eos_id: int) -> list[int]:
    """The response up to and including its first EOS (what a client sees)."""
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


def pad_to_length(ids: list[int], length: int, eos_id: int) -> list[int]:
    """A stored (EOS-truncated) response back to the fixed `length` the sampler and the ELBO use."""
    if len(ids) > length:
        raise ValueError(f"response of {len(ids)} tokens is longer than gen_length {length}")
    return list(ids) + [eos_id] * (length - len(ids))
