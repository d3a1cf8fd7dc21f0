"""The whole loop on one machine: the real server (vLLM engine) with the co-located learner (a Ray
actor) and a critic pre-trained by the cold-start step. Synthetic users reward replies that contain a
target word; the served model's rate of that word rises within a bounded number of feedback events,
through store, learner, published versions and engine swaps."""

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
from liveloop.store import Store, StoreConfig
from liveloop.model.corpus import TOPICS

from .conftest import open_store, start_server, stop_server

TARGET = "behold"
# The tuned learner preset (configs/fragments/tuned_learner.toml): the spec's length-adaptive lambda (alpha = 0.05)
# on a critic pre-trained first (`liveloop critic pretrain`), with a KL anchor to the base policy.
# Measured in-process: with a cold critic and alpha = 0.05 the rate does not move; without the anchor
# some seeds collapse to one degenerate 48-token reply (rate 0, ratio 1, zero gradient) and never recover.
PRESET = "tuned_learner"
MAX_EVENTS = 400  # bounded; the loop ends earlier once the recent reward rate is high
MAX_LAG = 8
WINDOW, ENOUGH = 40, 0.6


async def _ask(client: httpx.AsyncClient, i: int) -> dict:
    body = {
        "model": "liveloop-tiny",
        "messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}],
        "max_tokens": 48,
        "seed": 10_000 + i,
    }
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


async def _rate(client: httpx.AsyncClient, n: int, offset: int) -> tuple[float, set[int]]:
    replies = await asyncio.gather(*[_ask(client, offset + i) for i in range(n)])
    hits = sum(TARGET in r["choices"][0]["message"]["content"].lower() for r in replies)
    return hits / n, {r["policy_version"] for r in replies}


async def _scenario(base_url: str) -> dict:
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120) as client:
        before, versions_before = await _rate(client, 64, 0)
        events = 0
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        last_feedback = 0
        rewards: list[int] = []
        for i in range(MAX_EVENTS):
            if len(rewards) >= WINDOW and sum(rewards[-WINDOW:]) / WINDOW >= ENOUGH:
                break
            # users here rate far faster than real ones; keep the learner at most MAX_LAG ratings behind
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = (await client.get("/admin/learner", headers=admin)).json()
                if last_feedback - status["pending_cursor"] <= MAX_LAG:
                    break
                await asyncio.sleep(0.05)
            reply = await _ask(client, 1000 + i)
            reward = int(TARGET in reply["choices"][0]["message"]["content"].lower())
            rewards.append(reward)
            r = await client.post("/v1/feedback", json={"response_id": reply["id"], "reward": reward})
            r.raise_for_status()
            last_feedback = r.json()["id"]
            events += 1
        deadline = time.monotonic() + 120  # let the learner catch up and the server swap in its last version
        served = None
        while time.monotonic() < deadline:
            versions = (await client.get("/v1/versions")).json()
            published = [v for v in versions["data"] if v["status"] in ("serving", "published", "superseded", "retired")]
            served = versions["serving"]
            if published and served == max(v["version"] for v in published) and served > 0:
                samples = sum(v["samples_used"] for v in versions["data"] if v["version"] <= served)
                if samples >= events:
                    break
            await asyncio.sleep(1)
        after, versions_after = await _rate(client, 64, 0)
        learner = (await client.get("/admin/learner", headers=admin)).json()
        metrics = (await client.get("/metrics", headers=admin)).text
        return {
            "before": before, "after": after, "events": events, "served": served,
            "v_before": versions_before, "v_after": versions_after, "learner": learner, "metrics": metrics,
        }


def _pretrain_critic(workdir, model_dir) -> dict:
    store = Store(StoreConfig(url=f"sqlite:///{workdir / 'liveloop.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir.resolve()))
    learner = LearnerConfig(checkpoint_dir=str(workdir / "versions"))
    critic = CriticConfig(pretrain_reward=f"contains:{TARGET}", pretrain_rollouts=128, pretrain_ev_threshold=0.5)
    result = pretrain_for_learner(
        store.versions, store.feedback, learner, critic, model_dir, prompt=corpus_prompt,
        reward=make_reward(critic.pretrain_reward), progress=False,
    )
    store.close()
    return result


@pytest.mark.learning
def test_target_word_rate_rises(tmp_path, model_dir):
    workdir = tmp_path / "srv"
    workdir.mkdir()
    pretrained = _pretrain_critic(workdir, model_dir)
    assert pretrained["critic/explained_variance"] >= 0.5
    server = start_server(workdir, model_dir, "vllm", learner="", extends=PRESET)
    try:
        result = asyncio.run(_scenario(server.base_url))
    finally:
        stop_server(server)
    print({k: v for k, v in result.items() if k != "metrics"})
    assert result["v_before"] == {0} and result["served"] > 0 and result["v_after"] == {result["served"]}
    # a model that did not learn stays at its base rate; require a clear rise
    assert result["after"] >= result["before"] + 0.25, result
    learner = result["learner"]
    assert learner["running"] and learner["step"] >= result["events"] and 0 <= learner["idle_fraction"] <= 1
    assert 0 < learner["metrics"]["learner/kept_fraction"] <= 1
    for name in ("liveloop_learner_kept_fraction", "liveloop_critic_grad_norm", "liveloop_learner_idle_fraction"):
        assert name in result["metrics"]
    store = open_store(server)
    cursor = store.feedback.get_cursor("sao")
    assert cursor == max(f.id for f, _ in store.feedback.rated_after(0, 10_000)), "every rating consumed"
    store.close()
