"""Forget that reaches the weights, end to end: the real server (hf engine) with the co-located learner
(a Ray actor, the tuned preset, a critic pre-trained first). Other users first teach the model a phrase of their own on their
topics ("verily"); then a planted key joins and teaches it its own phrase on its topics ("hehe"), while
the others keep rating. Both rates are measured on fresh samples at the start (the base rates) and once
learned. `POST /admin/keys/{id}/forget` with `weights: true` (after a dry run that names the versions
and ratings) rolls the lineage back to before the planted key's first trained rating and the learner
trains the others' later ratings again; once that retrained lineage serves, the planted phrase's rate
is back within a binomial bound of its base rate, and the others' phrase stays above its base rate.
Bad bodies are 400 and an unknown key 404; `liveloop forget KEY --dry-run` prints the plan."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time

import httpx
import pytest

from liveloop.devtools import ADMIN_KEY, USER_KEY, USER_KEY_2, USER_KEYS
from liveloop.model.corpus import TOPICS
from liveloop.server.edge.auth import key_id

from liveloop.clients.rewards import corpus_prompt, make_reward
from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.critic_start import pretrain_for_learner
from liveloop.store import Store, StoreConfig

from .conftest import open_store, start_server, stop_server

PLANTED_PHRASE, OTHER_PHRASE = "behold", "verily"
PLANTED_TOPICS, OTHER_TOPICS = TOPICS[::2], TOPICS[1::2]
MEASURE_KEY = USER_KEYS[2]  # measures only: never rates
N = 48  # samples per rate measurement
ROUND = 8  # requests per key per round, generated together
# the tuned preset (alpha 0.05, k3 anchor) on a critic pre-trained for either phrase (as test_online_learning does for
# one); retention keeps every version here, so the forget goes back to the version the others' phase ended on
LEARNER = "keep_last_versions = 10000\n"
ENOUGH = 0.45  # a phase ends once its key's last 32 rewards average this much


def _upper(base: float, n: int = N) -> float:
    """The top of a ~99% binomial band around a rate measured on n samples (a second measurement of the
    same model lands below it), at least 3/n so a rare phrase's band is not empty."""
    p = max(base, 3 / n)
    return base + 2.6 * math.sqrt(p * (1 - p) / n) + 1 / n


async def _ask(client: httpx.AsyncClient, key: str, topic: str, seed: int) -> dict:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"Tell me about {topic}."}], "max_tokens": 40, "seed": seed}
    r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return r.json()


def _has(reply: dict, phrase: str) -> bool:
    return phrase in reply["choices"][0]["message"]["content"].lower()


async def _rate_of(client: httpx.AsyncClient, phrase: str, topics: tuple[str, ...], seed: int) -> float:
    replies = await asyncio.gather(*[_ask(client, MEASURE_KEY, topics[i % len(topics)], seed + i) for i in range(N)])
    return sum(_has(r, phrase) for r in replies) / N


async def _teach(client: httpx.AsyncClient, store, key: str, phrase: str, topics: tuple[str, ...], seed: int, n: int) -> list[int]:
    """`n` requests of `key` on its topics, each rated 1 when the reply has its phrase; returns rewards."""
    replies = await asyncio.gather(*[_ask(client, key, topics[(seed + i) % len(topics)], seed + i) for i in range(n)])
    rewards = [int(_has(r, phrase)) for r in replies]
    for reply, reward in zip(replies, rewards):
        r = await client.post("/v1/feedback", json={"response_id": reply["id"], "reward": reward}, headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
    return rewards


async def _keep_up(store, lag: int = 8, timeout: float = 180) -> None:
    """Users here rate far faster than real ones: wait until the learner is at most `lag` ratings behind
    (a learner that does not get there within `timeout` fails the test: it stalled)."""
    deadline = time.monotonic() + timeout
    while True:
        last = max((f.id for f, _ in store.feedback.rated_after(max(store.feedback.get_cursor("sao") - 1, 0), 10_000)), default=0)
        behind = last - store.feedback.get_cursor("sao")
        if behind <= lag:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the learner stalled: still {behind} ratings behind after {timeout:.0f} s")
        await asyncio.sleep(0.2)


async def _served_cursor(store, at_least: int, newer_than: int, timeout: float) -> int:
    """Wait until a version newer than `newer_than` whose training reached rating `at_least` serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        serving = store.versions.latest_version()
        if serving.version > newer_than and serving.metrics.get("learner/cursor", 0) >= at_least:
            return serving.version
        await asyncio.sleep(0.5)
    raise AssertionError(f"no version past {newer_than} with cursor >= {at_least} served within {timeout} s (serving: {store.versions.latest_version()})")


async def _scenario(base_url: str, store) -> dict:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    planted_id = key_id(USER_KEY_2)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        out = {
            "planted_base": await _rate_of(client, PLANTED_PHRASE, PLANTED_TOPICS, 1_000),
            "other_base": await _rate_of(client, OTHER_PHRASE, OTHER_TOPICS, 2_000),
        }
        # 1. the others teach their phrase
        rewards, seed = [], 10_000
        for _ in range(25):
            if len(rewards) >= 32 and sum(rewards[-32:]) / 32 >= ENOUGH:
                break
            rewards += await _teach(client, store, USER_KEY, OTHER_PHRASE, OTHER_TOPICS, seed, ROUND)
            seed += ROUND
            await _keep_up(store)
        out["phase1_events"] = len(rewards)
        out["other_phase1"] = await _rate_of(client, OTHER_PHRASE, OTHER_TOPICS, 2_000)
        print("phase 1:", out, sum(rewards[-32:]) / 32, flush=True)
        # 2. the planted key joins with its phrase; the others keep rating. The window's rate is a noisy
        # stopping rule (it stops on a lucky window): the phrase counts as learned once fresh samples show
        # it above the base's band; a look that falls short teaches 32 more events (at most three looks).
        planted: list[int] = []
        for look in range(3):
            enough = len(planted) + 32 if look else 32
            for _ in range(30):
                if len(planted) >= enough and sum(planted[-32:]) / 32 >= ENOUGH:
                    break
                got = await asyncio.gather(
                    _teach(client, store, USER_KEY_2, PLANTED_PHRASE, PLANTED_TOPICS, seed, ROUND),
                    _teach(client, store, USER_KEY, OTHER_PHRASE, OTHER_TOPICS, seed + ROUND, ROUND),  # as many as the planted key: a long phase 2 once wore the others' phrase down to 0.10 before any forget
                )
                planted += got[0]
                seed += 2 * ROUND
                await _keep_up(store)
            last = max(f.id for f, _ in store.feedback.rated_after(0, 100_000))
            learned = await _served_cursor(store, last, 0, 120)
            out["planted_learned"] = await _rate_of(client, PLANTED_PHRASE, PLANTED_TOPICS, 1_000)
            if out["planted_learned"] > _upper(out["planted_base"]):
                break
        out["phase2_events"] = len(planted)
        print("phase 2:", out, sum(planted[-32:]) / 32, flush=True)
        out["other_learned"] = await _rate_of(client, OTHER_PHRASE, OTHER_TOPICS, 2_000)
        print("learned:", out, flush=True)

        # bad requests: 400 / 404, nothing forgotten
        url = f"/admin/keys/{planted_id}/forget"
        assert (await client.post(url, json={"weights": "yes"}, headers=admin)).status_code == 400
        assert (await client.post(url, json={"dry_run": True}, headers=admin)).status_code == 400
        assert (await client.post(url, json={"weights": True, "extra": 1}, headers=admin)).status_code == 400
        missing = await client.post(f"/admin/keys/{'0' * 16}/forget", json={"weights": True}, headers=admin)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "key_not_found"

        # what a failure needs to be read: each key's ratings and quarantine, the events so far
        out["keys"] = [(k.key_id[:6], k.ratings, k.quarantined) for k in store.keys.key_states()]
        out["events"] = sorted({e.kind for e in store.operator.events(limit=10_000)})
        dry = (await client.post(url, json={"weights": True, "dry_run": True}, headers=admin)).json()
        (plan,) = dry["lineages"]
        assert dry["object"] == "api_key.forget_plan" and plan["target"] is not None and plan["affected"] and dry["replay"] > 0
        assert store.versions.latest_version().version == learned  # a dry run moves nothing
        cli = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "liveloop.cli", "forget", planted_id, "--dry-run", "--base-url", base_url, "--api-key", ADMIN_KEY],
            capture_output=True, text=True, timeout=60,
        )
        assert cli.returncode == 0 and f"would roll back to v{plan['target']}" in cli.stdout, cli.stdout + cli.stderr

        started = time.monotonic()
        done = (await client.post(url, json={"weights": True}, headers=admin)).json()
        assert done["ratings_deleted"] > 0 and done["done"][0]["target"] == plan["target"]
        # the learner's position reaches the last rating still stored up to where it was (the planted key's are gone)
        remaining = max(f.id for f, _ in store.feedback.rated_after(plan["target_cursor"], 100_000) if f.id <= plan["head_cursor"])
        retrained = await _served_cursor(store, remaining, max(plan["affected"]), 240)
        out |= {"forget_seconds": time.monotonic() - started, "plan": plan, "estimate_seconds": dry["estimate_seconds"]}
        chain, at = [], retrained
        while at is not None:
            chain.append(at)
            at = store.versions.get_version(at).parent
        out["chain"] = chain[:8]
        assert plan["target"] in chain and not set(plan["affected"]) & set(chain)  # the new lineage grows on the target
        out["planted_after"] = await _rate_of(client, PLANTED_PHRASE, PLANTED_TOPICS, 1_000)
        out["other_after"] = await _rate_of(client, OTHER_PHRASE, OTHER_TOPICS, 2_000)
        forbidden = await client.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": [{"role": "user", "content": "hi"}]},
                                      headers={"Authorization": f"Bearer {USER_KEY_2}"})
        out["planted_status"] = forbidden.status_code
    return out


def _pretrain_critic(workdir, model_dir) -> None:
    store = Store(StoreConfig(url=f"sqlite:///{workdir / 'liveloop.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir.resolve()))
    critic = CriticConfig(pretrain_reward=f"contains:{PLANTED_PHRASE}", pretrain_rollouts=128, pretrain_ev_threshold=0.5)
    planted, other = make_reward(f"contains:{PLANTED_PHRASE}"), make_reward(f"contains:{OTHER_PHRASE}")
    pretrain_for_learner(
        store.versions, store.feedback, LearnerConfig(checkpoint_dir=str(workdir / "versions")), critic, model_dir, prompt=corpus_prompt,
        reward=lambda text: max(planted(text), other(text)), progress=False,
    )
    store.close()


@pytest.mark.slow
@pytest.mark.learning
def test_forget_with_weights_unlearns_the_planted_phrase(tmp_path, model_dir):
    workdir = tmp_path / "srv"
    workdir.mkdir()
    _pretrain_critic(workdir, model_dir)
    server = start_server(workdir, model_dir, "hf", learner=LEARNER, extends="tuned_learner")
    store = open_store(server)
    try:
        result = asyncio.run(_scenario(server.base_url, store))
    finally:
        store.close()
        stop_server(server)
    print(result)
    assert result["planted_learned"] > _upper(result["planted_base"]), f"the planted phrase was not learned: {result}"
    assert result["planted_after"] <= _upper(result["planted_base"]), f"the planted phrase outlived the forget: {result}"
    assert result["other_after"] > _upper(result["other_base"]), f"the others' learning was lost: {result}"
    assert result["planted_status"] == 403  # the forgotten key is refused from then on
