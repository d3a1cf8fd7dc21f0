"""Ratings-to-effect for new objectives through the real server: simulated users reward a behaviour the
default model was never built for, and we count the ratings until the served model shows it.

For each objective (`contains:WORD`, `style:NAME`, `max_words:N`; clients/rewards.py) and each way of
learning (`shared`: the whole policy; `adapter`: one segment's LoRA adapter, `[segments] adapters =
"segment"`), on a fresh server (hf engine, the shipped learner: tuned preset + step-size control, a
critic pre-trained for version 0 on the objective, as `liveloop critic pretrain` does):
  1. probe: 48 fixed-seed prompts, the objective's rate under the base model;
  2. users ask and rate one reply at a time (the learner at most 8 ratings behind), up to --max-events;
  3. ratings-to-effect: the first rating count at which the moving average of the reward over --window
     ratings reaches the base rate + --lift; then probe again with the same 48 prompts.
The shared and adapter runs of an objective use the same prompts, seeds and pre-trained critic.

    .venv/bin/python bench/new_objectives.py [--objectives contains:behold style:classical max_words:12]
                                             [--modes shared adapter] [--max-events 300]
                                             [--learner "max_learning_rate = 2e-2"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from common import default_model, save  # noqa: E402

SEGMENT = "cozy"
SEGMENTS = {  # each mode's [segments] keys
    "shared": "",
    "adapter": f'adapters = "segment"\nnames = ["{SEGMENT}"]',
}
MAX_LAG = 8


async def _ask(client: httpx.AsyncClient, i: int) -> dict:
    from liveloop.model.corpus import TOPICS

    body = {
        "model": "liveloop-tiny", "max_tokens": 48, "seed": 10_000 + i, "metadata": {"segment": SEGMENT},
        "messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}],
    }
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


async def _probe(client: httpx.AsyncClient, reward, n: int = 48) -> float:
    replies = [await _ask(client, i) for i in range(n)]
    return sum(reward(r["choices"][0]["message"]["content"]) for r in replies) / n


async def _lane_cursor(client: httpx.AsyncClient, admin: dict, mode: str) -> int:
    status = (await client.get("/admin/learner", headers=admin)).json()
    return status["segments"][SEGMENT]["pending_cursor"] if mode == "adapter" else status["pending_cursor"]


async def _session(base_url: str, reward, mode: str, args) -> dict:
    from liveloop.devtools import ADMIN_KEY, USER_KEY

    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120) as client:
        before = await _probe(client, reward)
        goal = min(1.0, before + args.lift)
        rewards: list[float] = []
        reached, last_feedback, started = None, 0, time.monotonic()
        for i in range(args.max_events):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and last_feedback - await _lane_cursor(client, admin, mode) > MAX_LAG:
                await asyncio.sleep(0.05)
            reply = await _ask(client, 1000 + i)
            rewards.append(reward(reply["choices"][0]["message"]["content"]))
            r = await client.post("/v1/feedback", json={"response_id": reply["id"], "reward": int(rewards[-1])})
            r.raise_for_status()
            last_feedback = r.json()["id"]
            if len(rewards) >= args.window and sum(rewards[-args.window:]) / args.window >= goal:
                reached = len(rewards)
                break
        seconds = time.monotonic() - started
        await asyncio.sleep(args.settle)  # the last version published and swapped in
        after = await _probe(client, reward)
    return {"before": before, "goal": goal, "ratings_to_effect": reached, "ratings": len(rewards), "after": after, "seconds": seconds}


def _pretrain(workdir: Path, model_dir: Path, objective: str) -> dict:
    from liveloop.clients.rewards import corpus_prompt, make_reward
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.critic_start import pretrain_for_learner
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=f"sqlite:///{workdir / 'liveloop.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir.resolve()))
    critic = CriticConfig(pretrain_reward=objective, pretrain_rollouts=128, pretrain_ev_threshold=0.5)
    result = pretrain_for_learner(
        store.versions, store.feedback, LearnerConfig(checkpoint_dir=str(workdir / "versions")), critic, model_dir,
        prompt=corpus_prompt, reward=make_reward(objective), progress=False,
    )
    store.close()
    return result


def run(args) -> list[dict]:
    from liveloop.clients.rewards import make_reward
    from liveloop.devtools import start_server

    model_dir = default_model()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for objective in args.objectives:
            reward = make_reward(objective)
            seed_dir = Path(tmp) / objective.replace(":", "_") / "seed"
            seed_dir.mkdir(parents=True)
            critic = _pretrain(seed_dir, model_dir, objective)  # one critic (and base row) per objective, copied per mode
            for mode in args.modes:
                workdir = seed_dir.parent / mode
                shutil.copytree(seed_dir, workdir)
                server = start_server(workdir, model_dir, "hf", learner="\n".join(args.learner), segments=SEGMENTS[mode],
                                      extends=["tuned_learner", "step_control"])
                try:
                    out = asyncio.run(_session(server.base_url, reward, mode, args))
                finally:
                    server.stop()
                row = {"objective": objective, "mode": mode, "critic_ev": critic.get("critic/explained_variance"), **out}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", nargs="+", default=["contains:behold", "style:classical", "max_words:12"])
    parser.add_argument("--modes", nargs="+", default=["shared", "adapter"], choices=list(LEARNERS))
    parser.add_argument("--max-events", type=int, default=300)
    parser.add_argument("--window", type=int, default=40, help="moving-average window of the reward")
    parser.add_argument("--lift", type=float, default=0.25, help="the effect: the base rate + this")
    parser.add_argument("--learner", nargs="*", default=[], help="extra [learner] lines, e.g. max_learning_rate=2e-2")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds for the last version to swap in")
    args = parser.parse_args()
    rows = run(args)
    print("| objective | learning | base rate | ratings to effect | rate after (probe) | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        reached = r["ratings_to_effect"] if r["ratings_to_effect"] is not None else f"not within {r['ratings']}"
        print(f"| {r['objective']} | {r['mode']} | {r['before']:.2f} | {reached} | {r['after']:.2f} | {r['seconds']:.0f} |")
    print(f"saved {save('new_objectives' + ('-' + '-'.join(args.learner) if args.learner else ''), {'config': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
