"""Rated samples -> padded token tensors the policy and the critic both consume: `Sample` (one rated
response), `TokenBatch`, `make_batch` and `response_logprobs`.

A response a `keep` swap continued under new weights was sampled by more than one version: its
`version_spans` say which, and `TokenBatch.versions` carries that per token ([B, W], like the
behaviour logprobs, which stay exactly those of the version that sampled each token).

A response sampled under a constraint (a forced tool call, a JSON response format: its `grammar`)
was drawn from the model's distribution restricted to the tokens the grammar allowed at each
position, and its behaviour logprobs are of that restricted distribution. So the policy is scored the
same way: `make_batch` replays the grammar over the response (liveloop.grammar) into the packed masks
of the allowed tokens (`TokenBatch.allowed`), and `response_log_dists` masks the logits with them
before the log-softmax. The ratio pi/mu of a constrained token is then that of two distributions over
the same allowed set (exactly 1 on-policy), and a token the grammar forced (the only one allowed) has
logprob 0 under both: no ratio, no gradient, as it should be (the model had no choice)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from liveloop.episodes import token_versions
from liveloop.grammar import mask_logits


@dataclass(frozen=True)
class Sample:
    """One rated response as the learner sees it (docs/design.md, "The sample")."""

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    behavior_logprobs: np.ndarray
    action_mask: np.ndarray
    reward: float
    policy_version: int
    api_key_id: str = ""  # the key that rated it ("" for in-process rollouts)
    # (start, end, version) over response token indexes [start, end); None: every token by policy_version
    version_spans: tuple[tuple[int, int, int], ...] | None = None
    grammar: str | None = None  # the constraint its tokens were sampled under (None: free sampling)
    # an episode's constrained turns (rl/episodes.py): (start, end, grammar) over response token indexes;
    # the tokens outside them were free (or are observations)
    grammar_spans: tuple[tuple[int, int, str], ...] = ()

    @classmethod
    def from_rated(cls, feedback: Any, response: Any) -> "Sample":
        """A stored rating and the stored response it rates (`store.feedback.rated_after` rows)."""
        return cls(
            response.prompt_ids, response.response_ids, response.behavior_logprobs, response.action_mask,
            float(feedback.reward), response.policy_version, feedback.api_key_id,
            getattr(response, "version_spans", None),  # a row without spans: all of it by policy_version
            getattr(response, "grammar", None),
        )

    @classmethod
    def from_rollout(cls, rollout: Any, reward: float, policy_version: int = 0) -> "Sample":
        """An in-process rollout (`rl.rollout.Rollout`), every token an action."""
        n = len(rollout.response_ids)
        return cls(
            np.array(rollout.prompt_ids), np.array(rollout.response_ids), np.array(rollout.logprobs, np.float32),
            np.ones(n, np.uint8), reward, policy_version,
        )

    def token_versions(self) -> np.ndarray:
        """The version that sampled each response token, [n] int64."""
        return token_versions(len(self.response_ids), self.policy_version, self.version_spans)


@dataclass(frozen=True)
class TokenBatch:
    input_ids: Tensor  # [B, L] prompt + response, right-padded
    attention_mask: Tensor  # [B, L]
    prompt_lengths: list[int]
    response_ids: Tensor  # [B, W] right-padded with 0
    behavior_logprobs: Tensor  # [B, W]
    action_mask: Tensor  # [B, W] 0 on padding and observation tokens
    rewards: Tensor  # [B]
    # [B, W] the version that sampled each token; past a response's end its last token's version (so
    # `learner version - versions` stays a plain staleness there; the action mask drops it anyway)
    versions: Tensor
    # per sample: the packed masks [n, words] of the tokens its grammar allowed at each of its n tokens
    # (None: free sampling); a sample's grammar not replayed (`make_batch` without grammars) is UNMASKED
    allowed: tuple[Tensor | None, ...] = ()

    @property
    def width(self) -> int:
        return self.response_ids.shape[1]


class UnmaskedConstraint(ValueError):
    """A constrained response was to be scored without its grammar's masks (make_batch got no grammars)."""


UNMASKED = torch.empty(0, dtype=torch.int32)  # `TokenBatch.allowed` of a constrained sample whose grammar was not replayed


def make_batch(samples: Sequence[Sample], pad_id: int = 0, grammars: Any = None) -> TokenBatch:
    """The samples as padded tensors; `grammars` (liveloop.grammar.Grammars of the policy's tokenizer)
    replays each constrained sample's grammar into its masks (without it such a sample can be valued,
    not scored: `response_log_dists` refuses it)."""
    width = max(len(s.response_ids) for s in samples)
    length = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    B = len(samples)
    input_ids = torch.full((B, length), pad_id, dtype=torch.long)
    attn = torch.zeros(B, length, dtype=torch.long)
    resp = torch.zeros(B, width, dtype=torch.long)
    blp = torch.zeros(B, width)
    mask = torch.zeros(B, width)
    versions = torch.zeros(B, width, dtype=torch.long)
    for b, s in enumerate(samples):
        ids = np.concatenate([s.prompt_ids, s.response_ids]).astype(np.int64)
        input_ids[b, : len(ids)] = torch.from_numpy(ids)
        attn[b, : len(ids)] = 1
        n = len(s.response_ids)
        resp[b, :n] = torch.from_numpy(s.response_ids.astype(np.int64))
        blp[b, :n] = torch.from_numpy(s.behavior_logprobs.astype(np.float32))
        mask[b, :n] = torch.from_numpy(s.action_mask.astype(np.float32))
        per_token = s.token_versions()
        versions[b, :n] = torch.from_numpy(per_token)
        versions[b, n:] = int(per_token[-1]) if n else s.policy_version
    allowed = tuple(_allowed(s, grammars) for s in samples)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attn,
        prompt_lengths=[len(s.prompt_ids) for s in samples],
        response_ids=resp,
        behavior_logprobs=blp,
        action_mask=mask,
        rewards=torch.tensor([float(s.reward) for s in samples]),
        versions=versions,
        allowed=allowed if any(a is not None for a in allowed) else (),
    )


def _allowed(sample: Sample, grammars: Any) -> Tensor | None:
    spans = sample.grammar_spans or (((0, len(sample.response_ids), sample.grammar),) if sample.grammar is not None else ())
    if not spans:
        return None
    if grammars is None:
        return UNMASKED
    parts = [grammars.allowed(grammar, sample.response_ids[start:end]) for start, end, grammar in spans]
    if len(spans) == 1 and spans[0][:2] == (0, len(sample.response_ids)):
        return parts[0]
    out = torch.full((len(sample.response_ids), parts[0].shape[1]), -1, dtype=torch.int32)  # every bit: all allowed
    for (start, end, _), part in zip(spans, parts):
        out[start:end] = part
    return out


def response_log_dists(logits: Tensor, batch: TokenBatch) -> Tensor:
    """log pi(. | context) at each response position, [B, W, V] (float32), from the full-sequence logits
    [B, L, V], restricted to what a constrained response's grammar allowed there (`batch.allowed`);
    positions past a response's end are zeros (the action mask drops them)."""
    rows = []
    for b, p in enumerate(batch.prompt_lengths):
        row = logits[b, p - 1 : p - 1 + batch.width].float()
        allowed = batch.allowed[b] if batch.allowed else None
        if allowed is UNMASKED:
            raise UnmaskedConstraint("a response sampled under a grammar must be scored under it: make_batch(..., grammars=...)")
        if allowed is not None:  # the grammar's masks over the response's own tokens (padding past it stays)
            n = allowed.shape[0]
            row = torch.cat([mask_logits(row[:n], allowed), row[n:]])
        lp = torch.log_softmax(row, dim=-1)
        if lp.shape[0] < batch.width:
            lp = torch.cat([lp, lp.new_zeros(batch.width - lp.shape[0], lp.shape[1])])
        rows.append(lp)
    return torch.stack(rows)


def token_logprobs(dists: Tensor, batch: TokenBatch) -> Tensor:
    """log pi(y_t) for each response token, [B, W], read from `response_log_dists` (zeros past a
    response's end: its rows there are zeros)."""
    return dists.gather(2, batch.response_ids[:, :, None])[:, :, 0]


def response_logprobs(logits: Tensor, batch: TokenBatch) -> Tensor:
    """log pi(y_t) for each response token, [B, W], from the full-sequence logits [B, L, V]."""
    return token_logprobs(response_log_dists(logits, batch), batch)
