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
logprob 0 under both: no ratio, no gradient, as it should be (the model had no choice).

A response drawn at another temperature than 1 or under min-p/top-k/top-p cuts has the shaped
distribution's behaviour logprobs (liveloop/sampling.py): its `sampling` rides into `TokenBatch.draws`;
`response_log_dists` tempers the policy's logits after the grammar's mask, and `token_logprobs` scores
the drawn token under the model's own cut. Draws the learner cannot replay: `Unscorable("sampling")`.

A stored sample that cannot be scored (tokens its grammar forbids, ids outside the vocabulary, non-finite
logprobs, arrays of different lengths: a corrupt or poisoned record) is refused by `scorable` with the
reason (`Unscorable`) before it joins a batch; the learner skips it, counted (learner/episodes.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from liveloop.episodes import token_versions
from liveloop.grammar import ConstraintViolated, InvalidConstraint, mask_logits
from liveloop.sampling import Sampling, cut_mask, cuts, tempered


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
    # its grammar's packed masks, replayed already (`scorable`); None: `make_batch` replays them
    masks: Tensor | None = field(default=None, compare=False, repr=False)
    # how its tokens were drawn (liveloop.sampling), its behaviour logprobs that draw's distribution's;
    # None: the temperature-1 distribution, uncut. An episode's turns: (start, end, sampling) spans
    sampling: Sampling | None = None
    sampling_spans: tuple[tuple[int, int, Sampling], ...] = ()

    @classmethod
    def from_rated(cls, feedback: Any, response: Any) -> "Sample":
        """A stored rating and the stored response it rates (`store.feedback.rated_after` rows)."""
        return cls(
            response.prompt_ids, response.response_ids, response.behavior_logprobs, response.action_mask,
            float(feedback.reward), response.policy_version, feedback.api_key_id,
            getattr(response, "version_spans", None),  # a row without spans: all of it by policy_version
            getattr(response, "grammar", None),
            sampling=getattr(response, "sampling", None)
            or Sampling.logged_raw(getattr(response, "temperature", 1.0), getattr(response, "top_p", 1.0)),
        )

    @classmethod
    def from_rollout(cls, rollout: Any, reward: float, policy_version: int = 0) -> "Sample":
        """An in-process rollout (`rl.rollout.Rollout`), every token an action."""
        n = len(rollout.response_ids)
        return cls(
            np.array(rollout.prompt_ids), np.array(rollout.response_ids), np.array(rollout.logprobs, np.float32),
            np.ones(n, np.uint8), reward, policy_version,
        )

    def draws(self) -> tuple[tuple[int, int, Sampling], ...]:
        """(start, end, sampling) over its response tokens: how each part was drawn."""
        if self.sampling_spans:
            return self.sampling_spans
        return ((0, len(self.response_ids), self.sampling),) if self.sampling is not None else ()

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
    # per sample: the (start, end, sampling) spans whose draw shaped its distribution (temperature, cuts;
    # `response_log_dists` shapes the policy's the same way); () when no sample's was
    draws: tuple[tuple[tuple[int, int, Sampling], ...], ...] = ()

    @property
    def width(self) -> int:
        return self.response_ids.shape[1]

    @property
    def scored_positions(self) -> int:
        """How many of the last sequence positions carry a response token's context (from the shortest
        prompt's last token on): the only logits the learner reads (`policy_log_dists`)."""
        return self.input_ids.shape[1] - min(self.prompt_lengths) + 1


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
    draws = tuple(tuple(span for span in s.draws() if span[2].shaped) for s in samples)
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
        draws=draws if any(draws) else (),
    )


class Unscorable(ValueError):
    """A sample the learner cannot score; `reason` names the check it failed (one of REASONS)."""

    REASONS = ("lengths", "empty_prompt", "token_ids", "logprobs", "reward", "versions", "grammar", "sampling")

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def scorable(sample: Sample, vocab_size: int, grammars: Any = None, nan_logprobs: bool = False) -> Sample:
    """`sample`, checked that `make_batch` and a forward can score it, with its grammar's masks replayed
    (when `grammars` is given; the masks ride along, so `make_batch` does not replay them again). Raises
    Unscorable. `nan_logprobs`: a NaN behaviour logprob marks a token to score on-policy (the ablation's
    observations, learner/online.py), not a corrupt one."""
    prompt, resp = np.asarray(sample.prompt_ids), np.asarray(sample.response_ids)
    n = len(resp)
    shapes = {a.ndim for a in (prompt, resp, np.asarray(sample.behavior_logprobs), np.asarray(sample.action_mask))}
    if shapes != {1} or not n == len(sample.behavior_logprobs) == len(sample.action_mask):
        raise Unscorable("lengths", f"response {n} tokens, logprobs {len(sample.behavior_logprobs)}, mask {len(sample.action_mask)}")
    spans = sample.grammar_spans + sample.sampling_spans
    if any(not 0 <= start <= end <= n for start, end, _ in spans):
        raise Unscorable("lengths", f"grammar or sampling spans {[s[:2] for s in spans]} outside {n} tokens")
    for _, _, drawn in sample.draws():
        if (why := drawn.untrainable()) is not None:
            raise Unscorable("sampling", why)
    if len(prompt) == 0:
        raise Unscorable("empty_prompt", "no context to score the first token in")
    for name, ids in (("prompt", prompt), ("response", resp)):
        if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= vocab_size):
            raise Unscorable("token_ids", f"{name} ids {ids.dtype} in [{ids.min()}, {ids.max()}], vocabulary {vocab_size}")
    blp = np.asarray(sample.behavior_logprobs, dtype=np.float64)
    bad = ~np.isfinite(blp)
    if nan_logprobs:
        bad &= ~np.isnan(blp)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise Unscorable("logprobs", f"behaviour logprob {blp[i]} at token {i}")
    if not np.isfinite(float(sample.reward)):
        raise Unscorable("reward", f"reward {sample.reward}")
    try:
        sample.token_versions()
    except ValueError as exc:
        raise Unscorable("versions", str(exc)) from exc
    if grammars is None or sample.masks is not None:
        return sample
    try:
        masks = _allowed(sample, grammars)
    except (ConstraintViolated, InvalidConstraint) as exc:
        raise Unscorable("grammar", str(exc)) from exc
    except (RuntimeError, ValueError, TypeError) as exc:  # what xgrammar raises on a record it cannot walk
        raise Unscorable("grammar", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    return replace(sample, masks=masks) if masks is not None else sample


def _allowed(sample: Sample, grammars: Any) -> Tensor | None:
    if sample.masks is not None:
        return sample.masks
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


def policy_log_dists(model: Any, batch: TokenBatch) -> Tensor:
    """`response_log_dists` of `model` (a causal LM taking transformers' `logits_to_keep`) on `batch`. The
    head runs on the last `batch.scored_positions` positions only: the prompt's logits, [L, V] a row that
    nothing reads (49,152 floats a token on SmolLM2; gigabytes for an agent's 20k-token prompt), are never
    made, nor kept for the backward."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                logits_to_keep=batch.scored_positions)  # no KV cache to fill
    return response_log_dists(out.logits, batch)


def response_log_dists(logits: Tensor, batch: TokenBatch) -> Tensor:
    """log pi(. | context) at each response position, [B, W, V] (float32), from the logits of the last
    positions of the sequence ([B, L', V], L' <= L: the whole sequence's, or `policy_log_dists`'s),
    restricted to what a constrained response's grammar allowed there (`batch.allowed`); positions past a
    response's end are zeros (the action mask drops them)."""
    skipped = batch.input_ids.shape[1] - logits.shape[1]  # the leading positions the logits leave out
    if skipped > min(batch.prompt_lengths) - 1:
        raise ValueError(f"logits of the last {logits.shape[1]} positions miss response positions (need {batch.scored_positions})")
    rows = []
    for b, p in enumerate(batch.prompt_lengths):
        row = logits[b, p - 1 - skipped : p - 1 - skipped + batch.width].float()
        allowed = batch.allowed[b] if batch.allowed else None
        if allowed is UNMASKED:
            raise UnmaskedConstraint("a response sampled under a grammar must be scored under it: make_batch(..., grammars=...)")
        if allowed is not None:  # the grammar's masks over the response's own tokens (padding past it stays)
            n = allowed.shape[0]
            row = torch.cat([mask_logits(row[:n], allowed), row[n:]])
        if batch.draws and batch.draws[b]:
            row = _tempered(row, batch.draws[b])
        lp = torch.log_softmax(row, dim=-1)
        if lp.shape[0] < batch.width:
            lp = torch.cat([lp, lp.new_zeros(batch.width - lp.shape[0], lp.shape[1])])
        rows.append(lp)
    return torch.stack(rows)


def _tempered(row: Tensor, spans: tuple[tuple[int, int, Sampling], ...]) -> Tensor:
    """A row's logits [W, V] with each span divided by its draw's temperature."""
    parts, at = [], 0
    for start, end, drawn in spans:
        parts += [row[at:start], tempered(row[start:end], drawn)]
        at = end
    return torch.cat(parts + [row[at:]])


def token_logprobs(dists: Tensor, batch: TokenBatch) -> Tensor:
    """log pi(y_t) for each response token, [B, W], read from `response_log_dists` (zeros past a
    response's end: its rows there are zeros); a token drawn under min-p/top-k/top-p cuts is scored under
    the distribution's own cut (the drawn token kept in), renormalised: what its behaviour logprob is."""
    picked = dists.gather(2, batch.response_ids[:, :, None])[:, :, 0]
    if not any(cuts(s) for spans in batch.draws for _, _, s in spans):
        return picked
    rows = []
    for b, spans in enumerate(batch.draws):
        kept_mass = [dists.new_zeros(batch.width)]  # log of the kept tokens' mass, 0 where nothing was cut
        for start, end, s in spans:
            if cuts(s) and end > start:
                lp = dists[b, start:end]
                cut = cut_mask(lp, s, keep=batch.response_ids[b, start:end])
                mass = torch.logsumexp(lp.masked_fill(cut, float("-inf")), dim=-1)
                kept_mass.append(torch.cat([mass.new_zeros(start), mass, mass.new_zeros(batch.width - end)]))
        rows.append(torch.stack(kept_mass).sum(0))
    return picked - torch.stack(rows)


def response_logprobs(logits: Tensor, batch: TokenBatch) -> Tensor:
    """log pi(y_t) for each response token, [B, W], from the logits of the sequence's last positions
    (as `response_log_dists` takes them)."""
    return token_logprobs(response_log_dists(logits, batch), batch)
