"""An episode (an agent's turns, linked by the store) as ONE sample: its token sequence is the last
turn's prompt and sampled tokens, which carry every earlier turn's sampled tokens where the turns were
linked exactly; those are actions (action mask 1, their own behaviour logprobs, versions and grammar),
and everything between them is observation (the tool results, the user's turns, the template's glue:
mask 0, no loss, skipped by `gae_skip_observations`):

    [prompt][turn 1 sampled][obs][turn 2 sampled][obs] ... [last turn sampled]
     context   mask 1        mask 0   mask 1                    mask 1

`episode_sample` is a pure function of the turns' arrays (docs/design.md, "Episodes"):
  - the sample starts at the last turn whose prompt does not carry its parent's tokens exactly (an
    asserted link: `prefix_tokens` None), or at the first turn; what came before it is prompt;
  - turns up to `credited_through` (already trained by an earlier rating of the same rater) are
    context too: each action token is credited by the first rating at or after its turn;
  - a turn's final stop token the template rewrote (the next prompt carries the template's end marker,
    not the token sampled) is not in the context: it is neither action nor observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from liveloop.rl.batch import Sample, token_versions


class EpisodeMismatch(ValueError):
    """An episode's turns do not sit in its last prompt where their links say (a corrupt record)."""


def start_turn(turns: Sequence[Any]) -> int:
    """The first turn the sample covers: after the last link that is not an exact token extension."""
    start = 0
    for k in range(1, len(turns)):
        if turns[k].prefix_tokens is None:
            start = k
    return start


def episode_sample(
    turns: Sequence[Any], prompt_ids: np.ndarray, reward: float, api_key_id: str = "", credited_through: int = -1
) -> Sample:
    """The sample of an episode rated at its last turn. `turns`: first to last, each with prompt_tokens,
    prefix_tokens, response_ids, behavior_logprobs, version_spans, policy_version, grammar;
    `prompt_ids`: the last turn's prompt; `credited_through`: the index of the last turn an earlier
    rating of this rater trained (-1: none)."""
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
    return Sample(
        np.asarray(prompt_ids[:base], np.int64), response, behavior, mask, float(reward), last.policy_version, api_key_id,
        version_spans=_runs(versions), grammar_spans=tuple(grammars),
    )


def _runs(versions: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """Per-token versions as (start, end, version) runs."""
    out, start = [], 0
    for t in range(1, len(versions) + 1):
        if t == len(versions) or versions[t] != versions[start]:
            out.append((start, t, int(versions[start])))
            start = t
    return tuple(out)
