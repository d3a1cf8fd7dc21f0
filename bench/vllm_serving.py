"""vLLM's own serving benchmark as the yardstick (issue 36.2 and 36.5): `vllm.benchmarks.serve`
(openai-chat backend, streaming, `ignore_eos`, custom prompts) against liveloop and against vLLM's own
OpenAI server (`vllm.entrypoints.openai.api_server`) started with the engine arguments liveloop's vLLM
engine uses (`server.engines.vllm.engine.engine_args` of the arms' preset's `[engine]`, turned into
its command line here, so the two cannot drift apart; the same CPU environment).

Arms, each its own server process, all up at once:
- `vllm`: vLLM's OpenAI server;
- `learner`: liveloop on the arms' preset (`--preset`: tiny, or default on `--model`: the co-located learner on,
  every response logged to SQLite), nobody rating: the learner waits;
- `swaps`: the same liveloop server while a rater rates the replies the benchmark gets as they land
  (`--rate` a second): the learner trains and versions swap in under the benchmark's load (after each
  such run the bench waits for the learner to settle, so the next arm does not pay for it);
- `off`: liveloop on that preset with the learner off;
- `vllm_logprobs`: vLLM's server again, each request asking for the sampled token's logprob
  (`logprobs: true, top_logprobs: 0`), as liveloop computes for every token it serves: how much of a gap
  is that work rather than the server's (its first run is not its server's first: compare later runs).
(The per-key rate limits are off on the liveloop servers, as vLLM has none: a benchmark's 256 requests
a round would meet the default 600 a minute.)

Each server's first two replies are timed right after it is healthy (its /healthz, vLLM's /health); then
each serves its first benchmark run, back to back (the first run after start); later runs go round by
round, the arms in a rotating order, so each ratio compares runs under the same load on the machine (it
is shared: absolute figures move, the ratios are what count). Ratios are liveloop / vLLM's server:
output throughput (higher is better), TTFT and TPOT p50 (lower is better); later runs give the median
of the per-round ratios. ITL is vLLM's per SSE chunk: liveloop writes at most every
`[server] stream_interval_ms` (20) and sends nothing for tokens without text (this model repeats its
end token under `ignore_eos`), vLLM's server a chunk a token, so ITL is shown, not compared (TPOT is).
CPU per 1k output tokens of each server's processes (the server, vLLM's engine core, the learner with
Ray's processes) says where the time went whatever else ran on the machine; `CPU efficiency` is vLLM's
total over liveloop's. Every liveloop response must be in its store (checked at the end).

    .venv/bin/python bench/vllm_serving.py [--prompts 256] [--concurrency 16] [--output-len 64] [--rounds 4]
        [--arms vllm,vllm_logprobs,learner,swaps,off] [--rate 2] [--bare vllm,hf]
        [--model models/smollm2-135m-instruct --preset default]    # SmolLM2 with the default's learner

`--bare vllm,hf` then runs bench/serving_overhead.py for each backend: liveloop's HTTP streaming and
non-streaming against the bare engine (and vLLM's own server's, for vLLM).

The last line says PASS or FAIL: liveloop with the learner on (`learner`) at >= --goal (0.9) of vLLM's
throughput on the first run and on later runs, its first reply after healthy within
--first-reply-goal (2x) of its second, every response logged, and (with --bare) both HTTP modes at >=
--goal of the bare engine. Results: bench/results/vllm_serving.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from common import TOPICS, default_model, median, save  # noqa: E402

MODEL = "liveloop-tiny"  # the served name (--model: the directory's name)
PRESET = "tiny"  # the liveloop arms' preset and the engine arguments both servers start with (--preset)
ARMS = ("vllm", "vllm_logprobs", "learner", "swaps", "off")
# what the `vllm_logprobs` arm adds to each request: the sampled token's logprob, which liveloop computes for every
# token it serves (its behaviour logprobs); vLLM's client asks for none unless told
LOGPROBS_BODY = {"logprobs": True, "top_logprobs": 0}
# the engine arguments vLLM's server is given, by name (the rest are vLLM's defaults in both)
ENGINE_FLAGS = (
    "model", "tokenizer", "dtype", "max_model_len", "max_num_seqs", "gpu_memory_utilization", "enforce_eager",
    "distributed_executor_backend", "enable_prefix_caching", "enable_chunked_prefill", "max_num_batched_tokens",
    "seed", "trust_remote_code", "worker_extension_cls",
)
REPORTED = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms",
            "completed", "failed", "total_output_tokens", "duration")
RATIOS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_itl_ms")
CPU_PARTS = ("server", "engine", "learner")  # the server process, vLLM's engine core, the learner and Ray's processes


# -- the servers ---------------------------------------------------------------------------------------
def engine_cli(model_dir: Path) -> list[str]:
    """vLLM's server flags for the engine arguments liveloop's vLLM engine starts with on the default preset."""
    from liveloop.config import load_config
    from liveloop.server.engines.vllm.engine import engine_args

    # the preset's engine on this model, at the context the liveloop arms' servers get (devtools.write_config: 512)
    config = dataclasses.replace(load_config(PRESET).engine, model=str(model_dir), max_model_len=512)
    args = engine_args(config, str(model_dir))  # also sets the CPU environment liveloop sets (inherited below)
    flags = []
    for name in ENGINE_FLAGS:
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif value is not None:
            flags += [flag, str(value)]
    return flags


@dataclasses.dataclass
class VllmServer:
    base_url: str
    proc: subprocess.Popen

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)


def start_vllm(model_dir: Path, workdir: Path) -> VllmServer:
    from liveloop.devtools import free_port, wait_healthy

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *engine_cli(model_dir),
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = (workdir / "vllm_server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = VllmServer(f"http://127.0.0.1:{port}", proc)
    try:
        wait_healthy(proc, server.base_url + "/health", 600)
    except RuntimeError:
        server.stop()
        raise
    return server


def start_liveloop(model_dir: Path, workdir: Path, learner: bool):
    from liveloop.devtools import start_server

    return start_server(workdir, model_dir, "vllm", timeout=600, extends=PRESET, learner="" if learner else None,
                        served_model_name=MODEL)


# -- vLLM's client -------------------------------------------------------------------------------------
def dataset(path: Path, n: int) -> Path:
    """`n` short chat prompts, one JSON line each (vLLM's custom dataset)."""
    asks = ("Tell me about {}.", "What do you think of {}?", "Describe {}.", "Say something about {}.")
    lines = [json.dumps({"prompt": asks[(i // len(TOPICS)) % len(asks)].format(TOPICS[i % len(TOPICS)])}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def bench_run(base_url: str, key: str, data: Path, model_dir: Path, args, extra_body: dict | None = None) -> dict:
    """One run of vLLM's serving benchmark: its summary (REPORTED). `extra_body`: fields added to every request."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    ns = parser.parse_args([
        "--backend", "openai-chat", "--base-url", base_url, "--endpoint", "/v1/chat/completions", "--model", MODEL,
        "--tokenizer", str(model_dir), "--dataset-name", "custom", "--dataset-path", str(data), "--skip-chat-template",
        "--custom-output-len", str(args.output_len), "--num-prompts", str(args.prompts), "--max-concurrency",
        str(args.concurrency), "--ignore-eos", "--header", f"Authorization=Bearer {key}", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--ready-check-timeout-sec", "0",
        *(["--extra-body", json.dumps(extra_body)] if extra_body else []),
    ])
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        result = main(ns)
    return {k: result[k] for k in REPORTED}


def reply_seconds(base_url: str, key: str, max_tokens: int) -> float:
    """Seconds one chat reply of `max_tokens` takes, whole (non-streaming)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about cats."}], "max_tokens": max_tokens,
            "ignore_eos": True}
    start = time.perf_counter()
    r = httpx.post(base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    r.raise_for_status()
    return time.perf_counter() - start


# -- the rater of the swaps arm -------------------------------------------------------------------------
class Rater:
    """Rates the newest replies of one key in a liveloop store, `rate` a second, while `on` is set (a thread)."""

    def __init__(self, server, rate: float):
        self.server, self.rate = server, rate
        self.db = server.store_url.removeprefix("sqlite:///")
        self.on, self.stop = threading.Event(), threading.Event()
        self.key, self.rated, self.sent = "", set(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from liveloop.devtools import key_id

        rng = random.Random(0)
        with httpx.Client(base_url=self.server.base_url, timeout=30) as client:
            while not self.stop.is_set():
                if not self.on.wait(0.2):
                    continue
                time.sleep(1 / self.rate)
                with contextlib.closing(sqlite3.connect(self.db, timeout=5)) as db:
                    rows = db.execute("SELECT id FROM responses WHERE api_key_id = ? ORDER BY created_at DESC LIMIT 32",
                                      (key_id(self.key),)).fetchall()
                fresh = [r[0] for r in rows if r[0] not in self.rated]
                if fresh:
                    self.rated.add(fresh[0])
                    r = client.post("/v1/feedback", json={"response_id": fresh[0], "reward": rng.randint(0, 1)},
                                    headers={"Authorization": f"Bearer {self.key}"})
                    self.sent += r.status_code == 200


def version(server) -> int:
    """The newest version of any lineage (the whole policy's, or an adapter's: the default's learner
    publishes its shared adapter's, which /healthz's policy_version, the base weights', does not count)."""
    from liveloop.devtools import USER_KEY

    r = httpx.get(server.base_url + "/v1/versions", params={"order": "desc", "limit": 1},
                  headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=30)
    return int(r.json()["data"][0]["version"])


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of a server's process tree, by CPU_PARTS: on a shared machine a
    run's CPU a token says where its time went whatever else ran beside it."""
    import psutil

    root = psutil.Process(pid)
    out = dict.fromkeys(CPU_PARTS, 0.0)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            part = "server" if proc.pid == pid else "engine" if "EngineCore" in proc.name() else "learner"
            out[part] += t.user + t.system
        except psutil.Error:
            pass
    return out


def stored_responses(server) -> int:
    with contextlib.closing(sqlite3.connect(server.store_url.removeprefix("sqlite:///"), timeout=30)) as db:
        return db.execute("SELECT count(*) FROM responses").fetchone()[0]


# -- the run ----------------------------------------------------------------------------------------------
def run(args, model_dir: Path, work: Path) -> dict:
    from liveloop.devtools import USER_KEYS

    data = dataset(work / "prompts.jsonl", args.prompts)
    keys = iter(USER_KEYS * 8)  # a key a run: the learner's per-key cap (300 trained an hour) is never met
    servers: dict[str, object] = {}
    out: dict = {"first": {}, "later": {a: [] for a in args.arms}, "first_reply": {}, "versions": {}, "sent": {}}
    rater = None
    try:
        for arm in args.arms:  # start each and time its first two replies right after it is healthy
            if arm == "swaps":
                servers[arm] = servers["learner"]
                rater = Rater(servers[arm], args.rate)
                continue
            if arm == "vllm_logprobs":  # the same vLLM server, its requests asking for logprobs
                servers[arm] = servers["vllm"]
                continue
            where = work / arm
            where.mkdir()
            servers[arm] = start_vllm(model_dir, where) if arm == "vllm" else start_liveloop(model_dir, where, arm != "off")
            key = next(keys)
            first, second = reply_seconds(servers[arm].base_url, key, args.output_len), reply_seconds(servers[arm].base_url, key, args.output_len)
            out["first_reply"][arm] = {"first_s": first, "second_s": second}
            out["sent"][arm] = 2
            print(f"{arm}: first reply after healthy {first:.3f} s, second {second:.3f} s", flush=True)
        for arm in args.arms:  # each server's first benchmark run, back to back
            out["first"][arm] = one_run(arm, servers[arm], next(keys), data, model_dir, args, rater, out)
        for r in range(args.rounds):
            for arm in args.arms[r % len(args.arms):] + args.arms[: r % len(args.arms)]:
                out["later"][arm].append(one_run(arm, servers[arm], next(keys), data, model_dir, args, rater, out))
        if rater is not None:
            rater.stop.set()
        time.sleep(1)
        out["stored"] = {arm: stored_responses(s) for arm, s in servers.items() if arm in ("learner", "off")}
    finally:
        for s in {id(s): s for s in servers.values()}.values():
            s.stop()
    return out


def settle(server, seconds: float = 15.0) -> None:
    """Wait (at most `seconds`) until the learner stops publishing: what the rater sent is trained before
    another arm's run, so that run does not pay for it."""
    deadline, last = time.monotonic() + seconds, version(server)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = version(server)
        if now == last:
            return
        last = now


def one_run(arm: str, server, key: str, data: Path, model_dir: Path, args, rater: Rater | None, out: dict) -> dict:
    before = version(server) if arm in ("learner", "swaps") else None
    if arm == "swaps":
        rater.key = key
        rater.on.set()
    cpu = cpu_seconds(server.proc.pid)
    try:
        result = bench_run(server.base_url, key, data, model_dir, args, LOGPROBS_BODY if arm == "vllm_logprobs" else None)
    finally:
        if rater is not None:
            rater.on.clear()
    cpu = {k: v - cpu[k] for k, v in cpu_seconds(server.proc.pid).items()}
    result["cpu_ms_per_1k_tokens"] = {k: 1e6 * v / max(1, result["total_output_tokens"]) for k, v in cpu.items()}
    if arm == "swaps":
        settle(server)
    if before is not None:
        result["versions"] = version(server) - before
    out["sent"][arm] = out["sent"].get(arm, 0) + result["completed"]
    print(f"{arm}: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()})}", flush=True)
    return result


def ratios(out: dict, arm: str) -> dict:
    """liveloop arm / vLLM's server: the first run's, and the median of the later rounds' per-round ratios."""
    def one(ours: dict, theirs: dict) -> dict:
        r = {k: ours[k] / theirs[k] for k in RATIOS}
        r["cpu_efficiency"] = sum(theirs["cpu_ms_per_1k_tokens"].values()) / sum(ours["cpu_ms_per_1k_tokens"].values())
        return r

    first = one(out["first"][arm], out["first"]["vllm"])
    per_round = [one(a, b) for a, b in zip(out["later"][arm], out["later"]["vllm"])]
    later = {k: median([r[k] for r in per_round]) for k in first}
    return {"first": first, "later": later}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a checkpoint directory (default: the tiny model)")
    parser.add_argument("--preset", default="tiny", help="the liveloop arms' preset: tiny, or default (SmolLM2's learner)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rate", type=float, default=2.0, help="swaps arm: ratings a second")
    parser.add_argument("--goal", type=float, default=0.9)
    parser.add_argument("--first-reply-goal", type=float, default=2.0)
    parser.add_argument("--bare", default="", help="then against the bare engines too (bench/serving_overhead.py): "
                        "'vllm,hf', with --bare-rounds rounds each")
    parser.add_argument("--bare-rounds", type=int, default=4)
    args = parser.parse_args()
    args.arms = tuple(a for a in args.arms.split(",") if a)
    assert "vllm" in args.arms and set(args.arms) <= set(ARMS), f"--arms: vllm and any of {ARMS}"
    assert "swaps" not in args.arms or "learner" in args.arms, "--arms: swaps runs on the learner arm's server"
    args.arms = tuple(sorted(args.arms, key=ARMS.index))  # vllm first: vllm_logprobs runs on its server
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    global MODEL, PRESET
    model_dir = Path(args.model).resolve() if args.model else default_model()
    MODEL, PRESET = (model_dir.name if args.model else MODEL), args.preset
    with tempfile.TemporaryDirectory() as tmp:
        out = run(args, model_dir, Path(tmp))
    result = {"config": {k: v for k, v in vars(args).items()}, **out, "ratios": {}}
    print("\n| arm | run | tok/s | ratio | TTFT p50 ms (ratio) | TPOT p50 ms (ratio) | ITL p50 / p99 ms | "
          "CPU ms / 1k tokens: server, engine, learner | CPU efficiency | versions |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm in args.arms:
        rr = None if arm == "vllm" else ratios(out, arm)
        result["ratios"][arm] = rr
        for which in ("first", "later"):
            runs = [out["first"][arm]] if which == "first" else out["later"][arm]
            if not runs:
                continue
            m = {k: median([x[k] for x in runs]) for k in REPORTED}
            cpu = {k: median([x["cpu_ms_per_1k_tokens"][k] for x in runs]) for k in CPU_PARTS}
            q = rr[which] if rr else dict.fromkeys((*RATIOS, "cpu_efficiency"), 1.0)
            versions = sum(x.get("versions", 0) for x in runs) if arm in ("learner", "swaps") else ""
            print(f"| {arm} | {which} | {m['output_throughput']:.0f} | {q['output_throughput']:.2f} "
                  f"| {m['median_ttft_ms']:.1f} ({q['median_ttft_ms']:.2f}x) | {m['median_tpot_ms']:.2f} ({q['median_tpot_ms']:.2f}x) "
                  f"| {m['median_itl_ms']:.1f} / {m['p99_itl_ms']:.0f} | {cpu['server']:.0f}, {cpu['engine']:.0f}, {cpu['learner']:.0f} "
                  f"| {q['cpu_efficiency']:.2f} | {versions} |")
    for arm, fr in out["first_reply"].items():
        print(f"{arm}: first reply after healthy {fr['first_s']:.3f} s, second {fr['second_s']:.3f} s")
    failures = []
    for arm, n in out.get("stored", {}).items():
        sent = sum(n for a, n in out["sent"].items() if (a if a != "swaps" else "learner") == arm)
        print(f"{arm}: {n} responses stored of {sent} served")
        if n < sent:
            failures.append(f"{arm}: {sent - n} responses not logged")
    if "learner" in args.arms:
        for which in ("first", "later"):
            got = result["ratios"]["learner"][which]["output_throughput"]
            if got < args.goal:
                failures.append(f"learner {which} run at {got:.2f}x vLLM's throughput (goal {args.goal})")
        fr = out["first_reply"]["learner"]
        if fr["first_s"] > args.first_reply_goal * fr["second_s"]:
            failures.append(f"first reply after healthy {fr['first_s']:.2f} s, > {args.first_reply_goal}x the second's")
    for backend in [b for b in args.bare.split(",") if b]:
        import argparse as _argparse

        from serving_overhead import low_modes, overhead

        ns = _argparse.Namespace(backend=backend, requests=args.prompts, concurrency=args.concurrency, max_tokens=args.output_len,
                                 rounds=args.bare_rounds, vllm_server=backend == "vllm")
        result.setdefault("bare", {})[backend] = bare = overhead(model_dir, ns)
        for mode, got in low_modes(bare, args.goal).items():
            failures.append(f"{backend} HTTP {mode} at {got:.2f}x the bare engine (goal {args.goal})")
    print(f"saved {save('vllm_serving', result)}")
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
