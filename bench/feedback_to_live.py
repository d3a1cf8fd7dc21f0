"""Feedback-to-live latency: from `POST /v1/feedback` to the first response served by a version that
was trained on that rating (admitted at that version or a later one), with one user chatting and rating
every reply, and where that time goes. Also the learner's throughput and idle fraction while serving runs.

    .venv/bin/python bench/feedback_to_live.py [--seconds 90] [--backend vllm] [--arms default_before,default] [--rounds 3] [--think 0]

Arms, one server each, all started first and then driven in turns (`--rounds`, so drift in the machine's
load hits every arm alike; after each turn the bench chats without rating for `--tail` seconds so that
turn's last ratings go live):
  default         the tiny preset as it ships (`extends = "tiny"`: the default's learner, step control,
                  trust region and KL anchor, no overrides): the goal's arm;
  default_before  the same, with the serving side as it was before issue 36.3: vLLM reloads inside the
                  swap's pause (`[engine] vllm_weight_load = "reload"`) and the server finds a version
                  at its next `watch_seconds` poll only (`[transport] bell = false`);
  smollm2         configs/serve/default.toml on its own model, SmolLM2-135M-Instruct (the shipped default: one
                  shared LoRA adapter and a LoRA critic over the frozen base);
  default_thread  the same, with the hf engine on a thread of the server's process (`[engine] hf_worker =
                  "thread"`, the hf default before it had a process of its own);
  today           the former defaults: versions published every 4 steps or 5 s, saved as checkpoint directories
                  and swapped in by draining (what this benchmark measured before the memory path);
  live            the fast path with the tuned learner preset (configs/fragments/tuned_learner.toml, no KL
                  anchor): a version after every step (adaptive batch up to 16 ratings), handed to the
                  engine through shared memory, swapped in `keep` mode; the learner looks for ratings every
                  20 ms and the server for versions every 50 ms.

The timeline (each rating, then the median and p90 of each stage): `learner` from the rating to the
publish of the first version that trained on it and served (the version row's created_at: the learner's
poll, waiting for the step before, its own step, the publish); the server's stages from its log line for
that version (server/control/activator.py `_timeline`): `found` (the publish until the watcher looked),
`checked` (the store's word), `weights` (opened and verified), `swap` (the engine's, of which `held` held new
requests), `recorded` (the store's transaction), `freed`; `client` from the version serving to the end of
the first reply admitted at it (the bench's own loop: the reply running then, the next rating, a whole reply).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import httpx

from common import ROOT, chat_messages, default_model, percentile, save  # noqa: E402


ARMS = {
    "default": {"extends": "tiny"},
    "default_before": {"extends": "tiny", "engine": 'vllm_weight_load = "reload"', "transport": "bell = false"},
    "default_thread": {"extends": "tiny", "engine": 'hf_worker = "thread"'},
    # the shipped default on its own model: SmolLM2-135M-Instruct, one shared LoRA adapter and a LoRA critic
    "smollm2": {"extends": "default", "model": "models/smollm2-135m-instruct", "served": "smollm2-135m-instruct"},
    "today": {"publish_every": 4, "publish_seconds": 5.0, "max_batch": 0, "transport_backend": "checkpoint_dir", "swap_mode": "drain",
              "poll": 0.1, "watch": 0.1},
    "live": {"publish_every": 1, "publish_seconds": 0.5, "max_batch": 16, "transport_backend": "shared_memory", "swap_mode": "keep",
             "poll": 0.02, "watch": 0.05},
}
STAGES = ("learner", "found", "checked", "weights", "swap", "held", "recorded", "freed", "client")
_SERVED = re.compile(
    r"version (\d+) served ([\d.]+) ms after its publish: found after ([-\d.]+) ms, checked ([\d.]+) ms, weights ([\d.]+) ms, "
    r"swap ([\d.]+) ms \(held ([\d.]+) ms\), recorded ([-\d.]+) ms, freed ([\d.]+) ms"
)


def server_of(name: str, arm: dict, args: argparse.Namespace, model_dir: Path, workdir: Path):
    from liveloop.devtools import start_server

    if "extends" in arm:  # a preset as it ships: its own learner, nothing overridden but what the arm names
        engine, transport = arm.get("engine", ""), arm.get("transport", "")
        if "model" in arm:  # the arm's own model (imported once into models/ by `liveloop model init`)
            model_dir = ROOT / arm["model"]
        return start_server(workdir, model_dir, args.backend, learner="", extends=arm["extends"], engine_extra=engine,
                            extra=f"[transport]\n{transport}\n" if transport else "", timeout=600,
                            served_model_name=arm.get("served", "liveloop-tiny"))
    # over the tuned learner preset (configs/fragments/tuned_learner.toml): no pre-trained critic here, so
    # near-Monte-Carlo advantages (alpha = 1), and no KL anchor, as this benchmark has always measured
    learner = (
        f"publish_every_steps = {arm['publish_every']}\npublish_every_seconds = {arm['publish_seconds']}\n"
        f"max_batch_size = {arm['max_batch']}\npoll_seconds = {arm['poll']}\nlambda_alpha = 1.0\nkl_coef = 0.0\n"
    )
    return start_server(
        workdir, model_dir, args.backend, learner=learner, extends="tuned_learner",
        engine_extra=f'swap_mode = "{arm["swap_mode"]}"', server_extra=f"watch_seconds = {arm['watch']}",
        extra=f'[transport]\nbackend = "{arm["transport_backend"]}"\n',
    )


class Arm:
    """One arm's server and the bench's one user of it: `drive` it for a while (chats, each rated),
    `finish` with its figures. Arms are started together and driven in turns (`--rounds`)."""

    def __init__(self, name: str, spec: dict, args: argparse.Namespace, model_dir: Path, workdir: Path):
        from liveloop.devtools import USER_KEYS

        self.name, self.spec, self.args = name, spec, args
        self.server = server_of(name, spec, args, model_dir, workdir)
        self.user = httpx.Client(base_url=self.server.base_url, timeout=60)
        # 16 users take turns, each chatting and rating every reply (one key per user: the learner's
        # per-key influence cap sees 16 people, not one)
        self.auth = [{"Authorization": f"Bearer {key}"} for key in USER_KEYS]
        self.posts: list[tuple[float, int]] = []  # (wall time of POST /v1/feedback, feedback id)
        self.served: list[tuple[float, int]] = []  # (wall time a response completed, the version it was admitted at)
        self.chat_s: list[float] = []  # how long each chat took, and each rating (the bench's own loop)
        self.rate_s: list[float] = []
        self.i = 0

    def chat(self, max_tokens: int = 32) -> dict:
        t = time.time()
        r = self.user.post(
            "/v1/chat/completions", json={"model": self.spec.get("served", "liveloop-tiny"), "messages": chat_messages(self.i),
                                          "max_tokens": max_tokens},
            headers=self.auth[self.i % len(self.auth)],
        )
        r.raise_for_status()
        self.served.append((time.time(), r.json()["policy_version"]))
        self.chat_s.append(self.served[-1][0] - t)
        return r.json()

    def drive(self, seconds: float) -> None:
        """Chat and rate every reply for `seconds`, then chat without rating for `--tail` seconds so the
        last ratings can go live before the bench turns to another arm."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            body = self.chat()
            reward = int("behold" in body["choices"][0]["message"]["content"].lower())
            t = time.time()
            f = self.user.post("/v1/feedback", json={"response_id": body["id"], "reward": reward}, headers=self.auth[self.i % len(self.auth)])
            f.raise_for_status()
            self.rate_s.append(time.time() - t)
            self.posts.append((t, f.json()["id"]))
            self.i += 1
            time.sleep(self.args.think)
        deadline = time.monotonic() + self.args.tail
        while time.monotonic() < deadline:
            self.chat()
            self.i += 1

    def finish(self) -> dict:
        from liveloop.devtools import ADMIN_KEY

        try:
            versions = self.user.get("/v1/versions", headers=self.auth[0], params={"limit": 1000}).json()["data"]
            swaps = _swap_seconds(self.user.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text)
            status = self.user.get("/admin/learner", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
            self.user.close()
        finally:
            self.server.stop()
        stages = _server_stages(self.server.log_path.read_text(errors="replace"))
        created = _created(self.server.store_url)
        return figures(self, versions, swaps, status, stages, created)


def figures(arm: Arm, versions: list[dict], swaps: float | None, status: dict, stages: dict, created: dict) -> dict:
    """The arm's feedback-to-live latencies and their timeline (the module docstring)."""
    name, posts, served, args = arm.name, arm.posts, arm.served, arm.args
    cursor_of = {v["version"]: v["metrics"].get("learner/cursor", 0) for v in versions if v["version"] > 0}
    latencies, missing, timeline = [], 0, []
    for t_post, fid in posts:
        trained_in = [v for v, c in cursor_of.items() if c >= fid]
        if not trained_in:
            missing += 1
            continue
        v_f = min(trained_in)
        live = [t for t, v in served if t >= t_post and v >= v_f]
        if not live:
            missing += 1
            continue
        latencies.append(min(live) - t_post)
        went = min((v for v in stages if v >= v_f), default=None)  # the version that brought it live here
        if went is not None and went in created:
            s = stages[went]
            live_at = created[went] + s["served"] / 1000
            row = {k: s[k] for k in STAGES if k in s}
            row |= {"learner": 1000 * (created[went] - t_post), "client": 1000 * (min(live) - live_at)}
            timeline.append(row)
    busy = status.get("busy_seconds", 0.0)
    return {
        "arm": name,
        "config": arm.spec | {"backend": args.backend, "seconds": args.seconds, "think": args.think, "rounds": args.rounds},
        "ratings": len(posts),
        "went_live": len(latencies),
        "not_live_by_end": missing,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "versions_published": len(cursor_of),
        "versions_served": len(stages),
        "learner_samples": status.get("samples"),
        "learner_samples_per_busy_s": status.get("samples", 0) / busy if busy else None,
        "learner_idle_fraction": status.get("idle_fraction"),
        "swap_mean_s": swaps,
        "chat_p50_s": percentile(arm.chat_s, 50),
        "rating_p50_s": percentile(arm.rate_s, 50),
        "timeline_ms": {k: {"p50": percentile([r[k] for r in timeline if k in r], 50), "p90": percentile([r[k] for r in timeline if k in r], 90)}
                        for k in STAGES},
        "timeline_rows": timeline,
    }


def _server_stages(log: str) -> dict[int, dict[str, float]]:
    """Each served version's stages from the server's log lines (server/control/activator.py `_timeline`)."""
    out = {}
    for m in _SERVED.finditer(log):
        v, *ms = m.groups()
        out[int(v)] = dict(zip(("served", "found", "checked", "weights", "swap", "held", "recorded", "freed"), map(float, ms)))
    return out


def _created(store_url: str) -> dict[int, float]:
    """Each version's publish (its row's created_at, wall clock) from the arm's store."""
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=store_url))
    try:
        return {r.version: r.created_at.timestamp() for r in store.versions.list_versions()}
    finally:
        store.close()


def _swap_seconds(metrics: str) -> float | None:
    """The mean of the server's swap times (its Prometheus summary, all label sets together)."""
    total = count = 0.0
    for line in metrics.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name.endswith("server_swap_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif name.endswith("server_swap_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total / count if count else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--arms", default="default_before,default")
    parser.add_argument("--think", type=float, default=0.0, help="seconds between a rating and the next chat (0: back to back)")
    parser.add_argument("--tag", default="", help="appended to the result's file name (to keep several runs)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="the arms' servers run together and the bench drives them in turns, seconds/rounds each per round")
    parser.add_argument("--tail", type=float, default=3.0, help="seconds of chats without ratings after each turn (the last ratings go live)")
    args = parser.parse_args()
    model_dir = default_model()
    with tempfile.TemporaryDirectory() as tmp:
        arms: list[Arm] = []
        try:
            for name in args.arms.split(","):
                arms.append(Arm(name, ARMS[name], args, model_dir, Path(tmp) / name))
            for _ in range(args.rounds):  # in turns: drift in the machine's load hits every arm alike
                for arm in arms:
                    arm.drive(args.seconds / args.rounds)
        finally:
            results = []
            for arm in arms:
                results.append(arm.finish())
    print(f"\n{args.backend} engine, {args.seconds:.0f} s per arm in {args.rounds} turns, think time {args.think:g} s")
    print("| arm | ratings | live | feedback-to-live p50 | p99 | versions | served | mean swap | learner samples/s (busy) "
          "| learner idle | chat p50 | rating p50 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['arm']} | {r['ratings']} | {r['went_live']} | {r['p50_s']:.2f} s | {r['p99_s']:.2f} s | "
            f"{r['versions_published']} | {r['versions_served']} | {(r['swap_mean_s'] or 0) * 1000:.0f} ms | "
            f"{r['learner_samples_per_busy_s'] or 0:.1f} | {r['learner_idle_fraction']:.2f} | "
            f"{r['chat_p50_s'] * 1000:.0f} ms | {r['rating_p50_s'] * 1000:.0f} ms |"
        )
    print("\nwhere the time goes (ms, p50 / p90 over the ratings that went live):")
    print("| arm | " + " | ".join(STAGES) + " |")
    print("|---|" + "---|" * len(STAGES))
    for r in results:
        t = r["timeline_ms"]
        print(f"| {r['arm']} | " + " | ".join(f"{t[k]['p50']:.0f} / {t[k]['p90']:.0f}" for k in STAGES) + " |")
    tag = f"_{args.tag}" if args.tag else ""
    print(f"saved {save(f'feedback_to_live_{args.backend}_think{args.think:g}{tag}', {'arms': results})}")


if __name__ == "__main__":
    main()
