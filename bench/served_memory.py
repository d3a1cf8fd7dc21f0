"""Resident memory of the shipped default while it learns: the server, vLLM's engine core and the
learner's Ray actor, each process read every `--every` seconds while one user chats and rates.

    .venv/bin/python bench/served_memory.py                       # the default (SmolLM2), arms default and kv_1gib
    .venv/bin/python bench/served_memory.py --ratings 24 --arms default

Arms, one server at a time (memory is not shared between them):
  default   configs/serve/default.toml as it ships;
  kv_1gib   the same with `[engine] cpu_kv_cache_gb = 1`, vLLM-CPU's smallest setting in its own
            whole-GiB variable (the default before it took fractions);
  recompute the default with `[learner] recompute_over_tokens = 1`: every step recomputes its
            activations in the backward (learner/recompute.py).
Each arm: healthy, then `--ratings` chats of up to 100 tokens, each rated (alternately up and down) and the
next sent `--think` seconds later, then `--settle` seconds with nothing to do. Reported per process: RSS
when healthy, the peak while ratings arrive, and after settling (the learner has handed its freed heap
back: learner/heap.py). Goal of issue 43: learner plus engine at most 4 GB.

Writes bench/results/OUT.json (`--out`, served_memory by default).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, save  # noqa: E402  (bench/ is not a package)

from liveloop.devtools import USER_KEYS, start_server  # noqa: E402

ARMS = {  # ([engine] lines, [learner] lines) over the default
    "default": ("", ""), "kv_1gib": ("cpu_kv_cache_gb = 1", ""), "recompute": ("", "recompute_over_tokens = 1"),
}
ROLES = (("engine", "VLLM::EngineCore"), ("learner", "ray::LearnerActor"), ("server", "liveloop.cli"))


def rss_by_role(session: int) -> dict[str, float]:
    """GB resident of each role's process in the server's session (its process group and Ray's)."""
    found: dict[str, float] = {}
    for p in psutil.process_iter(["pid", "cmdline", "memory_info"]):
        try:
            if os.getsid(p.pid) != session or p.info["memory_info"] is None:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        for role, mark in ROLES:
            if mark in cmd:
                found[role] = max(found.get(role, 0.0), p.info["memory_info"].rss / 1e9)
    return found


class Sampler(threading.Thread):
    def __init__(self, session: int, every: float):
        super().__init__(daemon=True)
        self.session, self.every, self.peak, self.stop = session, every, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            now = rss_by_role(self.session)
            for role, gb in now.items():
                self.peak[role] = max(self.peak.get(role, 0.0), gb)
            if {"engine", "learner"} <= now.keys():
                self.peak["engine+learner"] = max(self.peak.get("engine+learner", 0.0), now["engine"] + now["learner"])


def run_arm(name: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), Path(args.model).resolve(), extends="default", learner=ARMS[name][1],
                              served_model_name="smollm2-135m-instruct", max_model_len=8192,
                              engine_extra=ARMS[name][0], timeout=600)
        try:
            healthy = rss_by_role(server.proc.pid)
            sampler = Sampler(server.proc.pid, args.every)
            sampler.start()
            client = httpx.Client(base_url=server.base_url, timeout=300, headers={"Authorization": f"Bearer {USER_KEYS[0]}"})
            for i in range(args.ratings):
                reply = client.post("/v1/chat/completions", json={
                    "model": "smollm2-135m-instruct", "max_tokens": 100,
                    "messages": [{"role": "user", "content": f"Tell me one thing about the number {i}."}]}).json()
                client.post("/v1/feedback", json={"response_id": reply["id"], "reward": i % 2}).raise_for_status()
                time.sleep(args.think)
            time.sleep(args.settle)
            sampler.stop.set()
            sampler.join()
            settled = rss_by_role(server.proc.pid)
            versions = client.get("/v1/versions").json()["data"]
        finally:
            server.stop()
    settled["engine+learner"] = settled.get("engine", 0.0) + settled.get("learner", 0.0)
    trained = sum(v["samples_used"] for v in versions)
    return {"arm": name, "engine_extra": ARMS[name][0], "learner_extra": ARMS[name][1], "healthy_gb": rounded(healthy), "peak_gb": rounded(sampler.peak),
            "settled_gb": rounded(settled), "versions": len(versions), "samples_trained": trained}


def rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in d.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--ratings", type=int, default=12)
    ap.add_argument("--think", type=float, default=3.0, help="seconds from a rating to the next chat")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds idle before the last reading")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between readings")
    ap.add_argument("--out", default="served_memory", help="result name under bench/results/")
    args = ap.parse_args()
    rows = []
    for arm in args.arms:
        row = run_arm(arm, args)
        print(f"{arm}: healthy {row['healthy_gb']}  peak {row['peak_gb']}  settled {row['settled_gb']}  "
              f"versions {row['versions']}  trained {row['samples_trained']}", flush=True)
        rows.append(row)
    print(save(args.out, {"args": vars(args), "arms": rows}, model_dir=Path(args.model)))


if __name__ == "__main__":
    main()
