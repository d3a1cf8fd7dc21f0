"""The BGPO job's objectives by name (`[bgpo] loss`), like the learner's methods (learner/methods.py):
each knows the old-policy terms it needs for a group and how to back-propagate the group's share of the
batch loss. `bgpo.py` looks one up once per run (`make_objective`) and never branches on the name.

| loss       | old-policy terms                          | backward                                   |
|------------|-------------------------------------------|--------------------------------------------|
| bgpo       | n_t ELBO terms [G, n_t]                   | per Monte-Carlo sample (memory flat in n_t) |
| vrpo_ol    | n_t ELBO terms [G, n_t]                   | one graph holding all n_t samples          |
| diffu_grpo | one-pass per-token logprobs per update    | one graph, a fresh prompt mask per update  |

The loss math is in `losses.py`; the group advantages are the RL core's (`rl/advantages.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from liveloop.diffusion.elbo import MaskDraw, elbo_terms, one_pass_logprobs, sample_elbo
from liveloop.diffusion.losses import bgpo_sample_loss, diffu_grpo_loss, vrpo_ol_loss
from liveloop.diffusion.model import MaskedDiffusionLM

if TYPE_CHECKING:
    from liveloop.diffusion.config import BGPOConfig


@dataclass(frozen=True)
class Prepared:
    """One group, ready for updates: tensors and the step's fixed noise."""

    prompt_ids: Tensor  # [G, P]
    responses: Tensor  # [G, L]
    advantages: Tensor  # [G]
    draw: MaskDraw
    old: Tensor  # [G, n_t] ELBO terms, or [U, G, L] one-pass logprobs for diffu_grpo
    pass_seeds: tuple[int, ...] = ()  # diffu_grpo: prompt-mask seed per inner update


class Objective(Protocol):
    name: str
    per_sample_backward: bool  # back-propagates one Monte-Carlo sample's graph at a time

    def old_terms(self, model: MaskedDiffusionLM, prompt_ids: Tensor, responses: Tensor, draw: MaskDraw,
                  gen: torch.Generator) -> tuple[Tensor, tuple[int, ...]]:
        """The old policy's terms for a group (the caller holds no_grad) and per-update seeds, if any."""

    def backward(self, model: MaskedDiffusionLM, p: Prepared, n_resp: int, update: int) -> dict[str, float]:
        """Accumulate the gradient of this group's share of the batch loss (n_resp responses in all)."""


class BGPO:
    """The bound is a sum over Monte-Carlo samples: each sample's graph is back-propagated alone."""

    name, per_sample_backward = "bgpo", True

    def __init__(self, cfg: BGPOConfig):
        self.n_t, self.clip, self.dual = cfg.n_t, cfg.clip_eps or None, cfg.dual_clip or None

    def old_terms(self, model, prompt_ids, responses, draw, gen):
        return elbo_terms(model, prompt_ids, responses, draw), ()

    def backward(self, model, p, n_resp, update):
        metrics: dict[str, float] = {}
        for j in range(self.n_t):  # one sample's graph at a time: memory constant in n_t
            lj = sample_elbo(model, p.prompt_ids, p.responses, p.draw.masks[:, j], p.draw.counts[:, j])
            loss, metrics = bgpo_sample_loss(lj, p.old[:, j], p.advantages, self.n_t, n_resp, self.clip, self.dual)
            loss.backward()
        return metrics


class _WholeGraph:
    """A loss over the whole group in one graph; its share G / n_resp of the batch loss goes back at once."""

    per_sample_backward = False

    def loss(self, model: MaskedDiffusionLM, p: Prepared, update: int) -> tuple[Tensor, dict[str, float]]:
        raise NotImplementedError

    def backward(self, model, p, n_resp, update):
        loss, metrics = self.loss(model, p, update)
        (loss * (p.responses.shape[0] / n_resp)).backward()
        return metrics


class VRPOOL(_WholeGraph):
    """VRPO-OL: exp(B_theta - B_old) A with every sample's graph held until backward."""

    name = "vrpo_ol"

    def __init__(self, cfg: BGPOConfig):
        self.clip, self.dual = cfg.clip_eps or None, cfg.dual_clip or None

    def old_terms(self, model, prompt_ids, responses, draw, gen):
        return elbo_terms(model, prompt_ids, responses, draw), ()

    def loss(self, model, p, update):
        terms = elbo_terms(model, p.prompt_ids, p.responses, p.draw)  # all n_t graphs at once
        return vrpo_ol_loss(terms, p.old, p.advantages, self.clip, self.dual)


class DiffuGRPO(_WholeGraph):
    """diffu-GRPO (d1): one-pass per-token estimates, a prompt mask drawn per inner update and shared by the
    old-policy pass and that update; PPO clip (0 = off)."""

    name = "diffu_grpo"

    def __init__(self, cfg: BGPOConfig):
        self.updates, self.prompt_mask_prob = cfg.inner_updates, cfg.prompt_mask_prob
        self.clip_eps = cfg.clip_eps or 1e9

    def old_terms(self, model, prompt_ids, responses, draw, gen):
        seeds = tuple(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)) for _ in range(self.updates))
        old = torch.stack([self._logprobs(model, prompt_ids, responses, s) for s in seeds])
        return old, seeds

    def loss(self, model, p, update):
        lp = self._logprobs(model, p.prompt_ids, p.responses, p.pass_seeds[update])
        return diffu_grpo_loss(lp, p.old[update], p.advantages, clip_eps=self.clip_eps)

    def _logprobs(self, model, prompt_ids, responses, seed: int) -> Tensor:
        return one_pass_logprobs(model, prompt_ids, responses, self.prompt_mask_prob, torch.Generator().manual_seed(seed))


OBJECTIVES: dict[str, type] = {"bgpo": BGPO, "vrpo_ol": VRPOOL, "diffu_grpo": DiffuGRPO}


def make_objective(cfg: BGPOConfig) -> Objective:
    """The objective `[bgpo] loss` names (the config loader accepts only these names)."""
    if cfg.loss not in OBJECTIVES:
        raise ValueError(f"bgpo.loss: expected one of {list(OBJECTIVES)}, got {cfg.loss!r}")
    return OBJECTIVES[cfg.loss](cfg)
