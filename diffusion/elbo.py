"""Likelihood estimates of a masked diffusion LM: the ELBO with stratified, shared masks (BGPO, VRPO) and
diffu-GRPO's one-pass per-token estimate. Owns mask drawing and the model passes; the loss math is in
`losses.py`.

For a response y of length L given prompt x, one Monte-Carlo sample j masks c_j response positions
(never the prompt) and scores them:
    l_j = (1 / p_j) * sum_{i masked} log p_theta(y_i | y_masked, x) / L,   p_j = c_j / L
Stratified counts over the n_t samples (LLaDA/VRPO): k ~ U{1..L}; c_j = round(linspace(k, k + (n_t-1)L/n_t,
n_t)) wrapped into 1..L. `draw_masks` draws them ONCE per response; the same `MaskDraw` is then used for
the old-policy pass and every update (common random numbers: d_j = l_theta^(j) - l_old^(j) only sees the
parameter change, not the mask noise).

Shapes: prompt_ids [N, P] (equal-length prompts, e.g. one group), response_ids [N, L], masks [N, n_t, L].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from liveloop.diffusion.model import MaskedDiffusionLM


@dataclass(frozen=True)
class MaskDraw:
    masks: Tensor  # [N, n_t, L] bool: which response positions sample j masks
    counts: Tensor  # [N, n_t] long: c_j = masks.sum(-1)

    @property
    def n_t(self) -> int:
        return self.masks.shape[1]


def stratified_counts(k: int, length: int, n_t: int) -> Tensor:
    """c_j = round(linspace(k, k + (n_t - 1) * L / n_t, n_t)) wrapped into 1..L, for a drawn k in 1..L."""
    c = torch.linspace(k, k + (n_t - 1) * length / n_t, n_t).round().long()
    return (c - 1) % length + 1


def draw_masks(num: int, length: int, n_t: int, generator: torch.Generator | None = None) -> MaskDraw:
    """n_t stratified masks for each of `num` responses of `length` positions (drawn once, reused)."""
    masks = torch.zeros(num, n_t, length, dtype=torch.bool)
    counts = torch.zeros(num, n_t, dtype=torch.long)
    for i in range(num):
        k = int(torch.randint(1, length + 1, (1,), generator=generator))
        counts[i] = stratified_counts(k, length, n_t)
        for j in range(n_t):
            masks[i, j, torch.randperm(length, generator=generator)[: counts[i, j]]] = True
    return MaskDraw(masks, counts)


def masked_input(prompt_ids: Tensor, response_ids: Tensor, mask: Tensor, mask_id: int) -> Tensor:
    """[prompt | response with `mask` positions replaced by MASK]: [N, P + L]."""
    noisy = torch.where(mask, torch.full_like(response_ids, mask_id), response_ids)
    return torch.cat([prompt_ids, noisy], dim=1)


def sample_elbo(model: MaskedDiffusionLM, prompt_ids: Tensor, response_ids: Tensor, mask: Tensor,
                count: Tensor) -> Tensor:
    """l_j [N] for ONE Monte-Carlo sample per response (mask [N, L], count [N]); one graph."""
    length = response_ids.shape[1]
    logits = model(masked_input(prompt_ids, response_ids, mask, model.mask_id))[:, prompt_ids.shape[1]:]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, response_ids[..., None])[..., 0]
    p = count.to(logp.dtype) / length
    return (1.0 / p) * (logp * mask).sum(dim=1) / length


def elbo_terms(model: MaskedDiffusionLM, prompt_ids: Tensor, response_ids: Tensor, draw: MaskDraw) -> Tensor:
    """All n_t terms [N, n_t] (one graph holding every sample: use under no_grad, or for VRPO-OL)."""
    return torch.stack([sample_elbo(model, prompt_ids, response_ids, draw.masks[:, j], draw.counts[:, j])
                        for j in range(draw.n_t)], dim=1)


def one_pass_logprobs(model: MaskedDiffusionLM, prompt_ids: Tensor, response_ids: Tensor,
                      prompt_mask_prob: float = 0.15, generator: torch.Generator | None = None) -> Tensor:
    """diffu-GRPO (d1): per-token log p(y_i) [N, L] from ONE pass with the whole response masked and each
    prompt token masked with probability `prompt_mask_prob` (fresh per call, as in d1)."""
    prompt_mask = torch.rand(prompt_ids.shape, generator=generator) < prompt_mask_prob
    noisy_prompt = torch.where(prompt_mask, torch.full_like(prompt_ids, model.mask_id), prompt_ids)
    x = torch.cat([noisy_prompt, torch.full_like(response_ids, model.mask_id)], dim=1)
    logits = model(x)[:, prompt_ids.shape[1]:]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, response_ids[..., None])[..., 0]
