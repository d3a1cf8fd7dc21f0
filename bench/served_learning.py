"""Served learning like the rig: the six objectives through the real server on the shipped default, ratings
to effect measured as the learning rig measures them, side by side with the rig on the same seeds.

For each objective (clients/rewards.py `SIX_OBJECTIVES`) and seed, and each arm (the shipped default, or
the default with some `[learner]` lines changed: the side-by-side runs that decide a default):
  1. the critic is the rig's (experiments/uptake.py `cached_critic`: the base's replies to the corpus
     prompts rated by the objective, one fit per objective and seed, shared with bench/new_objectives.py);
  2. the rig's run on that seed (experiments/uptake.py `uptake`, the shipped learner as in
     docs/results/new_objectives.md), unless --no-rig;
  3. a fresh `liveloop serve` (devtools.start_server: the real server, store, engine and co-located
     learner) on configs/serve/default.toml with only the test keys, paths and the arm's lines changed;
  4. one simulated user, HTTP only: the probe (the rig's 48 fixed prompts, fixed per-request seeds) before;
     then ask, read the reply, rate it (thumbs: the objective's 0/1) and ask the next one at once, the
     rig's prompts in the rig's order, `max_tokens` 48 as the rig samples, one API key, until the reward's
     40-rating moving average reaches the probe's rate + 0.25 (the rig's effect) or --max-ratings pass;
  5. once the learner has trained the last rating and its version serves, the probe again.
Per run: ratings to effect, the probe before and after, wall time, the versions published, and how far
behind the replies were (ratings the user had given that the serving version had not trained on when
the reply was sampled: the rig's `lag`, which there is at most 4).

    .venv/bin/python bench/served_learning.py [--objectives ...] [--seeds 0 1 2] [--max-ratings 200]
        [--arm NAME='[learner] lines;...'] [--no-rig] [--out served_learning] [--preset tiny|smollm2]

`--preset smollm2` runs the same user against the shipped default on its own model (SmolLM2-135M-Instruct,
configs/serve/default.toml as it is): there is no rig for it (the rig is the tiny model's), so no rig run and a
cold critic (the default's LoRA critic starts from the policy's weights, as it does for a real deployment).
    .venv/bin/python bench/served_learning.py --summarize LOG...     # the table from the rows logs printed

Prints one JSON row per run as it ends (`{"objective": ...}`), then the table; saves bench/results/OUT.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from common import RESULTS, default_model, logged_rows, save  # noqa: E402

PROBE_SEED = 12345  # the probe's per-request seeds: PROBE_SEED + i (before and after: a paired measure)
MAX_TOKENS = 48  # what the rig samples (experiments/rig.py LearningRig max_tokens)
RUN_FIELDS = ("objective", "seed", "arm", "before", "goal", "after", "ratings_to_effect", "ratings", "seconds", "ratings_per_second",
              "learner_busy_per_sample",
              "wall_seconds", "load", "to_version_p50", "to_version_p90", "versions", "lag_median", "lag_p90", "learner_steps", "superseded", "rig_ratings_to_effect",
              "rig_before", "rig_after")


PRESETS = {"tiny": "tiny", "smollm2": "default"}  # the served config each preset extends


def smollm2_model() -> Path:
    """The shipped default's model, imported from its package on first use (`liveloop model import`)."""
    from liveloop.config import load_config
    from liveloop.model.importer import ensure_imported

    from common import ROOT

    cfg = load_config("default")
    return ensure_imported(cfg.model.source, ROOT / cfg.model.out_dir)


def parse_arm(text: str) -> tuple[str, str]:
    """NAME=LINES: `[learner]` TOML lines over the default, ';'-separated (NAME alone: no lines)."""
    name, _, lines = text.partition("=")
    return name, "\n".join(line.strip() for line in lines.split(";") if line.strip())


SERVED = {"tiny": "liveloop-tiny", "smollm2": "smollm2-135m-instruct"}  # the presets' served model names


async def _chat(client: httpx.AsyncClient, prompt: str, seed: int, model: str = "liveloop-tiny") -> dict:
    body = {"model": model, "max_tokens": MAX_TOKENS, "seed": seed, "messages": [{"role": "user", "content": prompt}]}
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


async def _probe(client: httpx.AsyncClient, reward, prompts: list[str], model: str, concurrency: int = 8) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, p: str) -> float:
        async with gate:
            return reward((await _chat(client, p, PROBE_SEED + i, model))["choices"][0]["message"]["content"])

    scores = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return sum(scores) / len(scores)


async def _newest(client: httpx.AsyncClient) -> tuple[int | None, dict]:
    body = (await client.get("/v1/versions", params={"limit": 1, "order": "desc"})).json()
    return body["serving"], (body["data"][0] if body["data"] else {})


async def _settle(client: httpx.AsyncClient, last_feedback: int, timeout: float = 120) -> bool:
    """Until the newest version has trained the last rating and serves (False: not within `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        serving, newest = await _newest(client)
        if newest and serving == newest["version"] and (newest.get("metrics") or {}).get("learner/cursor", -1) >= last_feedback:
            return True
        await asyncio.sleep(0.25)
    return False


LEARNER_KEYS = ("learner/lr", "learner/step_kl", "learner/kl", "learner/kl_coef", "learner/kept_fraction", "learner/staleness_mean",
                "learner/batch_size", "learner/cut_steps", "learner/rejected_steps", "critic/value_error")


async def _learner(admin: httpx.AsyncClient) -> dict:
    """The learner's position, time and last metrics (`GET /admin/learner`)."""
    s = (await admin.get("/admin/learner")).json()
    m = s.get("metrics") or {}
    return {k: s.get(k) for k in ("version", "step", "samples", "pending_cursor", "busy_seconds", "idle_seconds")} | {
        k: m.get(k) for k in LEARNER_KEYS}


async def _user(base_url: str, objective: str, seed: int, args) -> dict:
    """The simulated user (the module docstring, steps 4-5): HTTP only. The admin key only reads the
    learner's status every 10 ratings (for the record; the user never waits on it)."""
    from liveloop.clients.rewards import corpus_prompt, make_reward
    from liveloop.devtools import ADMIN_KEY, USER_KEY
    from liveloop.experiments.uptake import probe_prompts

    reward = make_reward(objective)
    admin = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120)
    learner_trace = []
    async with admin, httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120) as client:
        probes = probe_prompts()
        model = SERVED[args.preset]
        before = await _probe(client, reward, probes, model)
        goal = min(1.0, before + args.lift)
        rng, rewards, trace, reached = random.Random(seed), [], [], None
        started = time.monotonic()
        while len(rewards) < args.max_ratings and (reached is None or args.no_stop):
            n = len(rewards)
            reply = await _chat(client, corpus_prompt(n, rng), seed * 1_000_003 + n, model)
            score = reward(reply["choices"][0]["message"]["content"])
            if args.think:
                await asyncio.sleep(args.think)  # a person reading the reply before the thumb
            fb = await client.post("/v1/feedback", json={"response_id": reply["id"], "reward": int(score)})
            fb.raise_for_status()
            rewards.append(score)
            trace.append({"version": reply["policy_version"], "feedback": fb.json()["id"], "t": time.monotonic() - started,
                          "at": time.time()})
            recent = rewards[-args.window:]
            if reached is None and len(recent) == args.window and sum(recent) / args.window >= goal:
                reached = len(rewards)
            if len(rewards) % 10 == 0:
                learner_trace.append({"ratings": len(rewards), "t": time.monotonic() - started, **await _learner(admin)})
        seconds = time.monotonic() - started
        settled = await _settle(client, trace[-1]["feedback"])
        learner = await _learner(admin)
        after = await _probe(client, reward, probes, model)
    return {"before": before, "goal": goal, "after": after, "ratings_to_effect": reached, "ratings": len(rewards),
            "seconds": seconds, "ratings_per_second": len(rewards) / seconds, "settled": settled, "rewards": rewards,
            "trace": trace, "learner_trace": learner_trace, "learner": learner,
            "learner_busy_per_sample": (learner["busy_seconds"] or 0) / max(1, learner["samples"] or 1)}


def _lags(store_url: str, trace: list[dict]) -> tuple[list[int], dict]:
    """For each reply, the ratings the user had already given that the version which served it had not
    trained on (its `learner/cursor`); and the versions the learner published."""
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=store_url))
    try:
        versions = [v for v in store.versions.list_versions() if v.version > 0]  # every lineage: the default publishes its shared adapter's
    finally:
        store.close()
    cursor = {v.version: int((v.metrics or {}).get("learner/cursor", 0)) for v in versions}
    given = [t["feedback"] for t in trace]
    lags = [sum(1 for f in given[:n] if f > cursor.get(t["version"], 0)) for n, t in enumerate(trace)]
    # seconds from a rating to the first version that trained on it (the learner's and the publisher's part
    # of feedback-to-live; the swap into the engine comes after)
    to_version = sorted(next((v.created_at.timestamp() - t["at"] for v in versions if cursor[v.version] >= t["feedback"]), float("nan"))
                        for t in trace)
    to_version = [x for x in to_version if x == x]
    last = (versions[-1].metrics or {}) if versions else {}
    return lags, {"to_version_p50": to_version[len(to_version) // 2] if to_version else None,
                  "to_version_p90": to_version[int(0.9 * (len(to_version) - 1))] if to_version else None, "versions": len(versions), "superseded": float(last.get("learner/superseded_versions", 0)),
                  "learner_steps": int(last.get("learner/step", 0)), "samples": int(last.get("learner/samples", 0))}


def served_run(model_dir: Path, critic_dir: Path, objective: str, seed: int, arm: tuple[str, str], args) -> dict:
    from liveloop.devtools import start_server

    name, lines = arm
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "served"
        if critic_dir is not None:  # the rig's pre-trained critic, where the learner looks for version 0's
            shutil.copytree(critic_dir, workdir)
        started = time.monotonic()
        server = start_server(workdir, model_dir, args.backend, learner=f"seed = {seed}\n{lines}", extends=PRESETS[args.preset],
                              served_model_name=SERVED[args.preset], timeout=600)
        try:
            out = asyncio.run(_user(server.base_url, objective, seed, args))
        finally:
            server.stop()
            logs = RESULTS / f"{args.out}_logs"  # the server's log of every run (a swap that never came, a crash)
            logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(server.log_path, logs / f"{objective.replace(':', '_')}-s{seed}-{name}.log")
        wall = time.monotonic() - started
        lags, versions = _lags(server.store_url, out["trace"])
    return {"arm": name, "arm_lines": lines, **out, "wall_seconds": wall, "load": os.getloadavg()[0], "lags": lags,
            "lag_median": statistics.median(lags), "lag_p90": sorted(lags)[int(0.9 * (len(lags) - 1))], **versions}


def rig_run(model_dir: Path, critic_dir: Path, critic_ev: float | None, objective: str, seed: int) -> dict:
    from liveloop.experiments.uptake import UptakeSpec, uptake

    with tempfile.TemporaryDirectory() as tmp:
        run = uptake(Path(tmp) / "rig", model_dir, UptakeSpec(objective, "shared", seed=seed, max_ratings=160),
                     critic_from=critic_dir, critic_ev=critic_ev)
    return {"rig_ratings_to_effect": run.ratings_to_effect, "rig_before": run.before, "rig_after": run.after, "rig_seconds": run.seconds}


def summarize(rows: list[dict]) -> str:
    """Per objective and arm: served ratings to effect per seed against the rig's, their medians and the ratio."""
    def cell(v):
        return "-" if v is None else str(v)

    def med(values, cap):
        return statistics.median([v if v is not None else cap + 1 for v in values])

    lines = ["| objective | arm | seeds | rig: ratings to effect | served: ratings to effect | median served / rig | served probe before -> after | rig probe before -> after | wall s per run | versions per rating | lag (median, p90) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["objective"], r["arm"]) for r in rows):
        runs = sorted((r for r in rows if (r["objective"], r["arm"]) == key), key=lambda r: r["seed"])
        rig = [r.get("rig_ratings_to_effect") for r in runs]
        served = [r["ratings_to_effect"] for r in runs]
        cap = max(r["ratings"] for r in runs)
        ratio = med(served, cap) / med(rig, 160) if all(r is not None for r in rig) else float("nan")
        lines.append(
            f"| `{key[0]}` | {key[1]} | {', '.join(str(r['seed']) for r in runs)} | {', '.join(map(cell, rig))} | "
            f"{', '.join(cell(v) if v is not None else '>' + str(r['ratings']) for v, r in zip(served, runs))} | {ratio:.2f} | "
            f"{statistics.mean(r['before'] for r in runs):.3f} -> {statistics.mean(r['after'] for r in runs):.3f} | "
            f"{statistics.mean(r.get('rig_before') or 0 for r in runs):.3f} -> {statistics.mean(r.get('rig_after') or 0 for r in runs):.3f} | "
            f"{', '.join(str(round(r['wall_seconds'])) for r in runs)} | "
            f"{statistics.mean(r['versions'] / max(1, r['ratings']) for r in runs):.2f} | "
            f"{statistics.median(r['lag_median'] for r in runs):g}, {max(r['lag_p90'] for r in runs)} |")
    return "\n".join(lines)


def main() -> None:
    from liveloop.clients.rewards import SIX_OBJECTIVES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", nargs="+", default=list(SIX_OBJECTIVES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--arm", action="append", default=None, metavar="NAME=LINES",
                        help="a server arm: [learner] lines over configs/serve/default.toml, ';'-separated "
                             "(default: one arm, 'default', the shipped preset as it is); repeat for side by side")
    parser.add_argument("--max-ratings", type=int, default=200, help="the user stops here if the effect has not come")
    parser.add_argument("--window", type=int, default=40, help="moving-average window of the reward (the rig's)")
    parser.add_argument("--lift", type=float, default=0.25, help="the effect: the probe's rate before + this (the rig's)")
    parser.add_argument("--no-stop", action="store_true", help="rate all --max-ratings even after the effect")
    parser.add_argument("--no-rig", action="store_true", help="skip the rig's run of each seed")
    parser.add_argument("--think", type=float, default=0.0, help="seconds the user reads a reply before rating it (0: at once)")
    parser.add_argument("--cold-critic", action="store_true",
                        help="no pre-trained critic, served and on the rig (the shipped default's own start: a cold critic)")
    parser.add_argument("--preset", choices=sorted(SERVED), default="tiny",
                        help="tiny: the tests' model beside the rig; smollm2: the shipped default on its own model")
    parser.add_argument("--backend", default=None, help="the engine (default: configs/serve/default.toml's)")
    parser.add_argument("--out", default="served_learning", help="result name under bench/results/")
    parser.add_argument("--critic-cache", default=str(Path(tempfile.gettempdir()) / "liveloop-critics"),
                        help="pre-trained critics, one per objective and seed (shared with bench/new_objectives.py)")
    parser.add_argument("--summarize", nargs="*", metavar="LOG", help="only table the JSON rows these logs printed")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(logged_rows(args.summarize, ("objective", "seed", "arm"))))
        return
    from liveloop.config import load_config
    from liveloop.experiments.uptake import UptakeSpec, cached_critic

    args.backend = args.backend or load_config("default").engine.backend
    arms = [parse_arm(a) for a in (args.arm or ["default"])]
    if args.preset == "smollm2":
        args.no_rig, args.cold_critic = True, True
    model_dir = default_model() if args.preset == "tiny" else smollm2_model()
    rows = []
    for objective in args.objectives:
        for seed in args.seeds:
            if args.preset == "smollm2":  # no rig and no rig's critic for it: the learner starts its critic cold
                for arm in arms:
                    row = {"objective": objective, "seed": seed, **served_run(model_dir, None, objective, seed, arm, args),
                           "critic_ev": None, "critic": "cold", "think": args.think, "preset": args.preset}
                    print(json.dumps({k: row.get(k) for k in RUN_FIELDS}), flush=True)
                    rows.append(row)
                continue
            critic_dir, ev = cached_critic(Path(args.critic_cache), model_dir, UptakeSpec(objective, "shared", seed=seed))
            if args.cold_critic:  # the same store, no critic where the learner looks for version 0's: it starts cold
                cold = Path(tempfile.mkdtemp(prefix="cold-critic-")) / "start"
                shutil.copytree(critic_dir, cold, ignore=shutil.ignore_patterns("versions"))
                critic_dir, ev = cold, None
            rig = {} if args.no_rig else rig_run(model_dir, critic_dir, ev, objective, seed)
            for arm in arms:
                row = {"objective": objective, "seed": seed, **served_run(model_dir, critic_dir, objective, seed, arm, args),
                       **rig, "critic_ev": ev, "critic": "cold" if args.cold_critic else "pre-trained", "think": args.think}
                print(json.dumps({k: row.get(k) for k in RUN_FIELDS}), flush=True)
                rows.append(row)
    print(summarize(rows))
    print(f"saved {save(args.out, {'config': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
