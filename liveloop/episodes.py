"""Where an episode's tokens sit: the layout both the learner (rl/episodes.py) and the store's export
(store/export.py `episode` shape) read an episode by (docs/design.md, "Episodes"). Pure: arrays in,
arrays out; it imports no component.

The sequence is the last turn's prompt and sampled tokens, which carry every earlier turn's sampled
tokens where the turns were linked exactly; those are actions (mask 1, their own behaviour logprobs,
versions and grammar) and everything between them is observation (the tool results, the user's turns,
the template's glue: mask 0):

    [prompt][turn 1 sampled][obs][turn 2 sampled][obs] ... [last turn sampled]
     context   mask 1        mask 0   mask 1                    mask 1

  - the layout starts at the last turn whose prompt does not carry its parent's tokens exactly (an
    asserted link: `prefix_tokens` None), or at the first turn; what came before it is prompt;
  - turns up to `credited_through` (already trained by an earlier rating of the same rater) are
    context too: each action token is credited by the first rating at or after its turn;
  - a turn's final stop token the template rewrote (the next prompt carries the template's end marker,
    not the token sampled) is not in the context: it is neither action nor observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class EpisodeMismatch(ValueError):
    """An episode's turns do not sit in its last prompt where their links say (a corrupt record)."""


def token_versions(n: int, policy_version: int, spans: Sequence[tuple[int, int, int]] | None) -> np.ndarray:
    """Per-token versions of an n-token response: `policy_version` everywhere, then each span's
    version over its [start, end). Spans outside [0, n) are a corrupt record, not something to clip."""
    out = np.full(n, policy_version, np.int64)
    for start, end, version in spans or ():
        if not 0 <= start <= end <= n:
            raise ValueError(f"version span ({start}, {end}, {version}) outside a response of {n} tokens")
        out[start:end] = version
    return out


@dataclass(frozen=True)
class EpisodeLayout:
    prompt_ids: np.ndarray  # context before the first token laid out
    response_ids: np.ndarray  # every token after it: actions and observations
    action_mask: np.ndarray  # uint8, 1 on actions
    behavior_logprobs: np.ndarray  # float32, 0 on observations (NaN: observations laid out as actions)
    versions: np.ndarray  # int64 per token (observations: the last turn's version)
    grammar_spans: tuple[tuple[int, int, str], ...]  # (start, end, grammar) of constrained turns
    turns: int  # how many turns it covers
    sampling_spans: tuple[tuple[int, int, Any], ...] = ()  # (start, end, liveloop.sampling.Sampling) of trained turns


def start_turn(turns: Sequence[Any]) -> int:
    """The first turn the layout covers: after the last link that is not an exact token extension."""
    start = 0
    for k in range(1, len(turns)):
        if turns[k].prefix_tokens is None:
            start = k
    return start


def episode_layout(
    turns: Sequence[Any], prompt_ids: np.ndarray, credited_through: int = -1, observations_as_actions: bool = False,
) -> EpisodeLayout:
    """The layout of an episode ending at its last turn. `turns`: first to last, each with prompt_tokens,
    prefix_tokens, response_ids, behavior_logprobs, version_spans, policy_version, grammar (and sampling);
    `prompt_ids`: the last turn's prompt; `credited_through`: the index of the last turn an earlier
    rating of this rater trained (-1: none). `observations_as_actions`: the ablation SAO argues against:
    the observation tokens after the first trained turn are in the loss and the GAE too, their behaviour
    logprobs NaN (nothing sampled them: the learner scores them on-policy, `OnlineLearner`)."""
    last = turns[-1]
    if len(prompt_ids) != last.prompt_tokens:
        raise EpisodeMismatch(f"the last turn's prompt has {len(prompt_ids)} tokens, its record says {last.prompt_tokens}")
    j = start_turn(turns)
    base = turns[j].prompt_tokens
    context = np.asarray(prompt_ids[base:], np.int64)
    response = np.concatenate([context, np.asarray(last.response_ids, np.int64)])
    n = len(response)
    mask = np.zeros(n, np.uint8)
    behavior = np.zeros(n, np.float32)
    versions = np.full(n, last.policy_version, np.int64)
    grammars: list[tuple[int, int, str]] = []
    draws: list[tuple[int, int, Any]] = []
    for k in range(j, len(turns)):
        turn = turns[k]
        if k + 1 < len(turns):  # an earlier turn: as many of its tokens as the next prompt carries
            carried = turns[k + 1].prefix_tokens - turn.prompt_tokens
            if not 0 <= carried <= len(turn.response_ids):
                raise EpisodeMismatch(f"turn {k} carries {carried} of its {len(turn.response_ids)} tokens")
        else:
            carried = len(turn.response_ids)
        at = turn.prompt_tokens - base
        got = response[at : at + carried]
        if not np.array_equal(got, np.asarray(turn.response_ids[:carried], np.int64)):
            raise EpisodeMismatch(f"turn {k}'s sampled tokens are not at position {turn.prompt_tokens} of the last prompt")
        if k <= credited_through or carried == 0:
            continue
        mask[at : at + carried] = 1
        behavior[at : at + carried] = np.asarray(turn.behavior_logprobs[:carried], np.float32)
        versions[at : at + carried] = token_versions(len(turn.response_ids), turn.policy_version, turn.version_spans)[:carried]
        if turn.grammar is not None:
            grammars.append((at, at + carried, turn.grammar))
        if getattr(turn, "sampling", None) is not None:
            draws.append((at, at + carried, turn.sampling))
    if observations_as_actions and mask.any():
        first = int(np.flatnonzero(mask)[0])
        between = np.flatnonzero(mask[first:] == 0) + first
        mask[between], behavior[between] = 1, np.nan
    return EpisodeLayout(np.asarray(prompt_ids[:base], np.int64), response, mask, behavior, versions, tuple(grammars),
                         len(turns) - j, tuple(draws))


def runs(versions: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """Per-token versions as (start, end, version) runs."""
    out, start = [], 0
    for t in range(1, len(versions) + 1):
        if t == len(versions) or versions[t] != versions[start]:
            out.append((start, t, int(versions[start])))
            start = t
    return tuple(out)
