"""Reads of episodes: the turns of an agent's trajectory, linked when they were written
(store/episode_links.py; docs/design.md, "Episodes"). `Store.episodes` is this, over the store's sessions.

An episode is read from its last turn back: `parent_id` links, one recursive query, at most MAX_TURNS.
Two continuations of one turn are two episodes that share the turns up to it; `EpisodeView.branches`
says, per turn, how many other continuations it has. A turn that is gone (deleted, taken by retention)
breaks the chain: what was read before it comes back with `complete` False, and the learner does not
train it (learner/episodes.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import ARRAY, BigInteger, any_, bindparam, func, literal, select

import liveloop.store.codec as codec
from liveloop.store.db import Part
from liveloop.store.grammars import NAMED
from liveloop.store.models import Feedback, Grammar, Response, aware
from liveloop.store.records import Episode, EpisodeTurn, EpisodeView, TurnView, stored_sampling

MAX_TURNS = 1024  # turns read back from one (a longer episode is read from its latest MAX_TURNS)


def chain_cte(response_id: str, limit: int = MAX_TURNS) -> Any:
    """(id, up, depth) from `response_id` (depth 0) back along `parent_id`, at most `limit` turns; the
    last row's `up` names the turn before the oldest one read (NULL: that one is a first turn)."""
    start = select(Response.id.label("id"), Response.parent_id.label("up"), literal(0).label("depth")).where(Response.id == response_id)
    chain = start.cte("chain", recursive=True)
    back = select(Response.id, Response.parent_id, chain.c.depth + 1).join(chain, Response.id == chain.c.up).where(chain.c.depth + 1 < limit)
    return chain.union_all(back)


def descendants_cte(ids: Sequence[str], limit: int = MAX_TURNS) -> Any:
    """(id, depth) of every turn continuing one of `ids` (not `ids` themselves), to `limit` turns deep."""
    start = select(Response.id.label("id"), literal(1).label("depth")).where(Response.parent_id.in_(list(ids)))
    tree = start.cte("tree", recursive=True)
    down = select(Response.id, tree.c.depth + 1).join(tree, Response.parent_id == tree.c.id).where(tree.c.depth < limit)
    return tree.union_all(down)


def _among(session: Any, column: Any, values: list[int]) -> Any:
    """`column IN values`: PostgreSQL's `= ANY(array)` (one parameter however many), else an IN list."""
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(bindparam("values", values, type_=ARRAY(BigInteger)))
    return column.in_(values)


class EpisodeQueries(Part):

    def episode(self, response_id: str) -> Episode | None:
        """The episode ending at `response_id`, first turn first, with that turn's prompt (it carries every
        earlier turn's tokens where they were linked exactly); None when no such response is stored."""
        chain = chain_cte(response_id)
        cols = (
            Response.id, Response.api_key_id, Response.parent_id, Response.turn, Response.policy_version, Response.prompt_tokens,
            Response.prefix_tokens, Response.response_ids, Response.behavior_logprobs, Response.version_spans,
            func.coalesce(Response.grammar, Grammar.text).label("grammar"),
            Response.finish_reason, Response.created_at, Response.sampling, Response.temperature, Response.top_p, chain.c.up, chain.c.depth,
        )
        with self._session() as s:
            rows = s.execute(
                select(*cols).join(chain, Response.id == chain.c.id).outerjoin(Grammar, NAMED).order_by(chain.c.depth.desc())
            ).all()
            if not rows:
                return None
            prompt = s.scalar(select(Response.prompt_ids).where(Response.id == response_id))
        turns = tuple(
            EpisodeTurn(
                r.id, r.api_key_id, r.parent_id, r.turn or 0, r.policy_version, r.prompt_tokens, r.prefix_tokens,
                codec.decode_ids(r.response_ids), codec.decode_floats(r.behavior_logprobs),
                None if r.version_spans is None else tuple((a, b, v) for a, b, v in r.version_spans),
                r.grammar, r.finish_reason, aware(r.created_at), stored_sampling(r.sampling, r.temperature, r.top_p),
            )
            for r in rows
        )
        return Episode(turns, codec.decode_ids(prompt), complete=rows[0].up is None)

    def carried_turn(self, api_key_id: str, hashes: Sequence[int]) -> tuple[int, np.ndarray, np.ndarray] | None:
        """The turn of `api_key_id` whose prompt and sampled text hash to the first of `hashes` (longest
        prefix first) that any turn's does, the latest of equal ones: (that hash, its prompt ids, its
        sampled ids). One indexed (api_key_id, text_hash) query, then one primary-key read."""
        if not hashes:
            return None
        with self._session() as s:
            found = s.execute(
                select(Response.id, Response.text_hash, Response.created_at)
                .where(Response.api_key_id == api_key_id, _among(s, Response.text_hash, list(hashes)))
            ).all()
            if not found:
                return None
            rank = {h: k for k, h in enumerate(hashes)}
            best = min(found, key=lambda r: (rank[r.text_hash], -aware(r.created_at).timestamp()))
            row = s.execute(select(Response.prompt_ids, Response.response_ids).where(Response.id == best.id)).one_or_none()
        if row is None:
            return None
        return best.text_hash, codec.decode_ids(row.prompt_ids), codec.decode_ids(row.response_ids)

    def rated_turns(self, turn_ids: Sequence[str], api_key_id: str, before_feedback_id: int) -> set[str]:
        """Which of `turn_ids` `api_key_id` rated with a rating older than `before_feedback_id`."""
        with self._session() as s:
            return set(s.scalars(select(Feedback.response_id).where(
                Feedback.response_id.in_(list(turn_ids)), Feedback.api_key_id == api_key_id, Feedback.id < before_feedback_id
            )))

    def view(self, response_id: str) -> EpisodeView | None:
        """What an operator sees of the episode ending at `response_id`: per turn its version, lengths,
        the observation tokens before it, its tool calls, its owner's rating, its other continuations."""
        chain = chain_cte(response_id)
        cols = (
            Response.id, Response.api_key_id, Response.turn, Response.policy_version, Response.prompt_tokens, Response.completion_tokens,
            Response.prefix_tokens, Response.linked_by, Response.finish_reason, Response.output, Response.created_at, chain.c.up,
        )
        with self._session() as s:
            rows = s.execute(select(*cols).join(chain, Response.id == chain.c.id).order_by(chain.c.depth.desc())).all()
            if not rows:
                return None
            ids = [r.id for r in rows]
            children = dict(s.execute(select(Response.parent_id, func.count()).where(Response.parent_id.in_(ids)).group_by(Response.parent_id)).all())
            ratings = dict(s.execute(
                select(Feedback.response_id, Feedback.reward).join(Response, Response.id == Feedback.response_id)
                .where(Feedback.response_id.in_(ids), Feedback.api_key_id == Response.api_key_id)
            ).all())
        turns = []
        for k, r in enumerate(rows):
            nxt = 1 if k + 1 < len(rows) else 0  # the continuation this episode takes
            calls = [c["function"]["name"] for c in ((r.output or {}).get("tool_calls") or ())]
            turns.append(TurnView(
                r.id, r.turn or 0, r.policy_version, r.prompt_tokens, r.completion_tokens,
                None if r.prefix_tokens is None or k == 0 else r.prompt_tokens - r.prefix_tokens,
                r.linked_by, r.finish_reason, tuple(calls), ratings.get(r.id), children.get(r.id, 0) - nxt, aware(r.created_at),
            ))
        return EpisodeView(rows[-1].api_key_id, tuple(turns), complete=rows[0].up is None)

    def session_turn(self, api_key_id: str, tag: str) -> str | None:
        """The latest turn of `api_key_id` with episode tag `tag` (a client session's: what rating the
        session rates); None when the key has none. One (api_key_id, episode_tag) index search."""
        with self._session() as s:
            return s.scalar(
                select(Response.id).where(Response.api_key_id == api_key_id, Response.episode_tag == tag)
                .order_by(Response.created_at.desc(), Response.id.desc()).limit(1)
            )

    def latest(self, limit: int, policy_version: int | None = None, api_key_id: str | None = None) -> list[str]:
        """The last turns of the newest multi-turn episodes (turns nothing continues), newest first."""
        child = Response.__table__.alias("child")
        q = (
            select(Response.id).where(Response.turn > 0)
            .where(~select(child.c.id).where(child.c.parent_id == Response.id).exists())
            .order_by(Response.created_at.desc(), Response.id.desc()).limit(limit)
        )
        if policy_version is not None:
            q = q.where(Response.policy_version == policy_version)
        if api_key_id is not None:
            q = q.where(Response.api_key_id == api_key_id)
        with self._session() as s:
            return list(s.scalars(q))
