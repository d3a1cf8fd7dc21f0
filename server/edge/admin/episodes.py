"""Operators' view of agents' episodes (store/episodes.py): `GET /admin/episodes` lists the newest
multi-turn episodes (their last turns), optionally of one version or one key; `GET
/admin/episodes/{response_id}` shows the episode ending at that turn: per turn its version, prompt and
reply lengths, the observation tokens before it, the tools it called, its owner's rating and how many
other continuations branch off it. Admin keys only; key ids are the store's digests."""

from __future__ import annotations

import asyncio
import dataclasses
from fastapi import APIRouter, Depends, Query

from liveloop.server.edge.admin.protocol import EpisodeBody, EpisodeList, TurnBody
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.dependencies import admin_episodes as handler
from liveloop.server.edge.errors import APIError
from liveloop.store.episodes import EpisodeQueries
from liveloop.store.records import EpisodeView

router = APIRouter(prefix="/admin")


def _view(response_id: str, view: EpisodeView) -> EpisodeBody:
    turns = [TurnBody(**dataclasses.asdict(t) | {"tool_calls": list(t.tool_calls), "created_at": t.created_at.isoformat()}) for t in view.turns]
    rated = [t.reward for t in view.turns if t.reward is not None]
    return EpisodeBody(
        id=view.turns[0].id, last_turn=response_id, key_id=view.api_key_id, complete=view.complete, turns=turns,
        turn_count=len(turns),
        tokens=sum(t.prompt_tokens for t in view.turns[:1]) + sum(t.completion_tokens + (t.observation_tokens or 0) for t in view.turns),
        tool_calls=sum(len(t.tool_calls) for t in view.turns), reward=view.turns[-1].reward, ratings=len(rated),
        versions=sorted({t.policy_version for t in view.turns}), branches=sum(t.other_branches for t in view.turns),
    )


class AdminEpisodes:
    """Agents' episodes as operators read them."""

    def __init__(self, episodes: EpisodeQueries):
        self.episodes = episodes

    async def latest(self, limit: int, version: int | None, key_id: str | None) -> EpisodeList:
        episodes = self.episodes
        ids = await asyncio.to_thread(episodes.latest, limit, version, key_id)
        views = await asyncio.to_thread(lambda: [(i, episodes.view(i)) for i in ids])
        return EpisodeList(data=[_view(i, v) for i, v in views if v is not None])

    async def one(self, response_id: str) -> EpisodeBody:
        if len(response_id) > 64:
            raise APIError(400, "response_id: at most 64 characters", param="response_id")
        view = await asyncio.to_thread(self.episodes.view, response_id)
        if view is None:
            raise APIError(404, f"no response `{response_id}`", param="response_id", code="not_found")
        return _view(response_id, view)


@router.get("/episodes")
async def episodes(
    h: AdminEpisodes = Depends(handler), limit: int = Query(50, ge=1, le=500), version: int | None = Query(None, ge=0, le=2**31 - 1),
    key_id: str | None = Query(None, max_length=64), _: Principal = Depends(require_admin),
) -> EpisodeList:
    return await h.latest(limit, version, key_id)


@router.get("/episodes/{response_id}")
async def episode(response_id: str, h: AdminEpisodes = Depends(handler), _: Principal = Depends(require_admin)) -> EpisodeBody:
    return await h.one(response_id)
