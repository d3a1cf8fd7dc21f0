"""Per-segment adapters through the whole loop: the real server (hf engine through peft) with the
co-located learner, `[segments] adapters = "segment"`. Users of the "cozy" segment reward replies that
contain a target word; users of the "night" segment ask too but never rate. Cozy's adapter learns
the word through its own lane, versions and swaps; night is still served by the base weights, byte
for byte, and its lane never publishes."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from liveloop.clients.rewards import corpus_prompt, make_reward
from liveloop.critic.config import CriticConfig
from liveloop.devtools import ADMIN_KEY, USER_KEY
from liveloop.learner.config import LearnerConfig
from liveloop.learner.critic_start import pretrain_for_learner
from liveloop.model.corpus import TOPICS
from liveloop.store import Store, StoreConfig

from .conftest import open_store, start_server, stop_server

TARGET = "behold"
LEARNER = 'lora = { rank = 8, alpha = 16.0 }'
SEGMENTS = 'adapters = "segment"\nnames = ["cozy", "night"]\n'  # [segments]
MAX_EVENTS = 400  # bounded; ends earlier once cozy's recent reward rate is high
MAX_LAG = 8
WINDOW, ENOUGH = 40, 0.6


async def _ask(client: httpx.AsyncClient, i: int, segment: str) -> dict:
    body = {
        "model": "liveloop-tiny",
        "messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}],
        "max_tokens": 48, "seed": 10_000 + i, "metadata": {"segment": segment},
    }
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


async def _probe(client: httpx.AsyncClient, segment: str, n: int = 48) -> tuple[float, list[str], set[int]]:
    replies = [await _ask(client, i, segment) for i in range(n)]
    texts = [r["choices"][0]["message"]["content"] for r in replies]
    return sum(TARGET in t.lower() for t in texts) / n, texts, {r["policy_version"] for r in replies}


async def _scenario(base_url: str) -> dict:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120) as client:
        cozy_before, _, cozy_v_before = await _probe(client, "cozy")
        _, night_before, night_v_before = await _probe(client, "night")
        rewards: list[int] = []
        last_feedback = 0
        for i in range(MAX_EVENTS):
            if len(rewards) >= WINDOW and sum(rewards[-WINDOW:]) / WINDOW >= ENOUGH:
                break
            deadline = time.monotonic() + 60  # keep the learner at most MAX_LAG ratings behind
            while time.monotonic() < deadline:
                lane = (await client.get("/admin/learner", headers=admin)).json()["segments"]["cozy"]
                if last_feedback - lane["pending_cursor"] <= MAX_LAG:
                    break
                await asyncio.sleep(0.05)
            await _ask(client, 5000 + i, "night")  # night asks, never rates
            reply = await _ask(client, 1000 + i, "cozy")
            reward = int(TARGET in reply["choices"][0]["message"]["content"].lower())
            rewards.append(reward)
            r = await client.post("/v1/feedback", json={"response_id": reply["id"], "reward": reward})
            r.raise_for_status()
            last_feedback = r.json()["id"]
        deadline = time.monotonic() + 120  # the lane's last version published and activated
        while time.monotonic() < deadline:
            lane = (await client.get("/admin/learner", headers=admin)).json()["segments"]["cozy"]
            if lane["cursor"] >= last_feedback:
                adapters = (await client.get("/admin/adapters", headers=admin)).json()
                serving = {a["segment"]: a["serving"] for a in adapters["segments"]}
                if serving.get("cozy") == lane["version"]:
                    break
            await asyncio.sleep(1)
        cozy_after, _, cozy_v_after = await _probe(client, "cozy")
        _, night_after, night_v_after = await _probe(client, "night")
        learner = (await client.get("/admin/learner", headers=admin)).json()
        return {
            "events": len(rewards), "cozy_before": cozy_before, "cozy_after": cozy_after,
            "cozy_v": (cozy_v_before, cozy_v_after), "night_v": (night_v_before, night_v_after),
            "night_same": night_before == night_after, "learner": learner,
        }


def _pretrain_critic(workdir, model_dir) -> None:
    """Version 0's critic (every lane starts from it), fitted to the target word's reward."""
    store = Store(StoreConfig(url=f"sqlite:///{workdir / 'liveloop.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir.resolve()))
    critic = CriticConfig(pretrain_reward=f"contains:{TARGET}", pretrain_rollouts=128, pretrain_ev_threshold=0.5)
    pretrain_for_learner(
        store.versions, store.feedback, LearnerConfig(checkpoint_dir=str(workdir / "versions")), critic, model_dir,
        prompt=corpus_prompt, reward=make_reward(critic.pretrain_reward), progress=False,
    )
    store.close()


@pytest.mark.learning
def test_a_segments_adapter_learns_and_the_others_stay_put(tmp_path, model_dir):
    workdir = tmp_path / "srv"
    workdir.mkdir()
    _pretrain_critic(workdir, model_dir)
    server = start_server(workdir, model_dir, "hf", learner=LEARNER, segments=SEGMENTS, extends="tuned_learner")
    try:
        result = asyncio.run(_scenario(server.base_url))
    finally:
        stop_server(server)
    print({k: v for k, v in result.items() if k != "learner"})
    cozy_lane, night_lane = (result["learner"]["segments"][s] for s in ("cozy", "night"))
    assert result["cozy_v"][0] == {0} and len(result["cozy_v"][1]) == 1 and result["cozy_v"][1] != {0}
    assert result["cozy_after"] >= result["cozy_before"] + 0.25, result
    # night never rated: its lane trained nothing, it is served by the base weights, byte for byte
    assert night_lane["samples"] == 0 and night_lane["version"] == 0
    assert result["night_v"] == ({0}, {0}) and result["night_same"]
    assert cozy_lane["samples"] == result["events"]
    store = open_store(server)
    cozy_versions = [r for r in store.versions.list_versions() if r.segment == "cozy"]
    assert cozy_versions and not [r for r in store.versions.list_versions() if r.segment == "night"]
    served = {r.segment for f, r in store.feedback.rated_after(0, 10_000)}
    assert served == {"cozy"}
    store.close()
