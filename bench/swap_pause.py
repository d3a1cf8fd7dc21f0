"""Swap pause: request latency (first token and whole response) under steady load while new weights
are hot-swapped every few seconds, against the same load without swaps, in one run on one server;
plus the swap time itself (the admin call) and how long new requests were held back (drain mode: the
drain and the load; keep mode: what the engine's own load held them, vLLM's pause or the hf worker's
copy). The swaps are operator checkpoints (`POST /admin/weights`), read from disk at each swap.

    .venv/bin/python bench/swap_pause.py [--concurrency 8] [--phase-seconds 15] [--swap-every 2] [--backend vllm|hf]
        [--swap-mode drain|keep] [--loads staged,reload] [--tag NAME]

vLLM: `--loads` runs one server per `[engine] vllm_weight_load` (staged: the weights loaded beside the
serving model, the pause copies them in; reload: vLLM's reload_weights inside the pause, the path
before), all started up front and loaded in turns (steady, then swapping, arm after arm, `--repeats`
times), so drift in the machine's load hits every arm alike: the holds side by side in one run.

Results: bench/results/swap_pause_<backend>_<mode>[_<tag>].json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from common import chat_messages, default_model, median, percentile, save  # noqa: E402


async def load_phase(client: httpx.AsyncClient, seconds: float, concurrency: int, max_tokens: int) -> dict:
    """`concurrency` users each sending streaming requests back to back for `seconds` (bounded)."""
    ttft, total, failures = [], [], 0
    deadline = time.monotonic() + seconds

    async def user(u: int) -> None:
        nonlocal failures
        i = 0
        while time.monotonic() < deadline:
            body = {"model": "liveloop-tiny", "messages": chat_messages(u + i), "max_tokens": max_tokens, "stream": True, "seed": i}
            start = time.perf_counter()
            first = None
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        failures += 1
                        continue
                    async for line in r.aiter_lines():
                        if first is None and '"content":"' in line and '"content":""' not in line:
                            first = time.perf_counter()
                        if line == "data: [DONE]":
                            break
                    else:
                        failures += 1
                        continue
            except httpx.HTTPError:
                failures += 1
                continue
            end = time.perf_counter()
            total.append(end - start)
            ttft.append((first or end) - start)
            i += 1

    await asyncio.gather(*[user(u) for u in range(concurrency)])
    return {"ttft": ttft, "total": total, "failures": failures}


async def swapper(admin: httpx.AsyncClient, dirs: list[Path], every: float, seconds: float) -> list[dict]:
    swaps = []
    deadline = time.monotonic() + seconds
    k = 0
    while time.monotonic() + every < deadline:
        await asyncio.sleep(every)
        r = await admin.post("/admin/weights", json={"path": str(dirs[k % len(dirs)]), "note": "bench"})
        r.raise_for_status()
        swaps.append(r.json())
        k += 1
    return swaps


def _empty() -> dict:
    return {"ttft": [], "total": [], "failures": 0}


async def run(args) -> dict:
    from liveloop.devtools import ADMIN_KEY, USER_KEY, perturbed_checkpoint, start_server

    model_dir = default_model()
    loads = args.loads.split(",") if args.backend == "vllm" else ["-"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dirs = [perturbed_checkpoint(model_dir, tmp / f"w{s}", seed=s) for s in (1, 2)]
        servers = {}
        out: dict[str, dict] = {}
        try:
            for load in loads:
                extra = f'swap_mode = "{args.swap_mode}"' + (f'\nvllm_weight_load = "{load}"' if load != "-" else "")
                servers[load] = await asyncio.to_thread(start_server, tmp / f"server-{load}", model_dir, args.backend, engine_extra=extra)
                out[load] = {"results": {"steady": _empty(), "swapping": _empty()}, "swaps": []}
            clients = {
                load: (
                    httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120),
                    httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120),
                )
                for load, server in servers.items()
            }
            for user, _ in clients.values():
                await load_phase(user, 3, args.concurrency, args.max_tokens)  # warm-up
            for _ in range(args.repeats):  # alternate, so drift in machine load hits every phase and arm alike
                for load, (user, admin) in clients.items():
                    results = out[load]["results"]
                    for phase in ("steady", "swapping"):
                        tasks = [load_phase(user, args.phase_seconds, args.concurrency, args.max_tokens)]
                        if phase == "swapping":
                            tasks.append(swapper(admin, dirs, args.swap_every, args.phase_seconds))
                        got = await asyncio.gather(*tasks)
                        for key in ("ttft", "total"):
                            results[phase][key] += got[0][key]
                        results[phase]["failures"] += got[0]["failures"]
                        if phase == "swapping":
                            out[load]["swaps"] += got[1]
            for user, admin in clients.values():
                await user.aclose()
                await admin.aclose()
        finally:
            for server in servers.values():
                server.stop()
    return out


def summarize(res: dict) -> dict:
    return {
        phase: {
            "requests": len(r["total"]),
            "failures": r["failures"],
            "p50_s": percentile(r["total"], 50),
            "p99_s": percentile(r["total"], 99),
            "ttft_p50_s": percentile(r["ttft"], 50),
            "ttft_p99_s": percentile(r["ttft"], 99),
        }
        for phase, r in res.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--phase-seconds", type=float, default=15)
    parser.add_argument("--swap-every", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--swap-mode", default="keep", choices=["drain", "keep"],
                        help="keep (the default preset's): running generations continue under the new weights; drain: a swap waits for them")
    parser.add_argument("--loads", default="staged,reload",
                        help="vllm: the [engine] vllm_weight_load of each arm's server (staged, reload), loaded in turns")
    parser.add_argument("--tag", default="", help="appended to the result's file name (to keep several runs)")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    arms = {}
    print("| arm | load | requests | failures | latency p50 | p99 | first token p50 | p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for load, got in out.items():
        summary = summarize(got["results"])
        s, w = summary["steady"], summary["swapping"]
        arm = f"{args.backend} {args.swap_mode}" + (f" {load}" if load != "-" else "")
        for name, x in (("no swaps", s), (f"swap every {args.swap_every:g}s", w)):
            print(
                f"| {arm} | {name} | {x['requests']} | {x['failures']} | {x['p50_s']*1000:.0f} ms | {x['p99_s']*1000:.0f} ms "
                f"| {x['ttft_p50_s']*1000:.0f} ms | {x['ttft_p99_s']*1000:.0f} ms |"
            )
        print(f"| {arm} | ratio (swaps / none) | | | {w['p50_s']/s['p50_s']:.2f} | {w['p99_s']/s['p99_s']:.2f} "
              f"| {w['ttft_p50_s']/s['ttft_p50_s']:.2f} | {w['ttft_p99_s']/s['ttft_p99_s']:.2f} |")
        swap_ms = [x["swap_ms"] for x in got["swaps"]]
        held_ms = [x["held_ms"] for x in got["swaps"]]
        arms[load] = {"summary": summary, "swap_ms": swap_ms, "held_ms": held_ms}
    print()
    print("| arm | swaps | admin call p50 | p99 | new requests held p50 | p90 | max |")
    print("|---|---|---|---|---|---|---|")
    for load, a in arms.items():
        arm = f"{args.backend} {args.swap_mode}" + (f" {load}" if load != "-" else "")
        h = a["held_ms"]
        print(f"| {arm} | {len(h)} | {median(a['swap_ms']):.0f} ms | {percentile(a['swap_ms'], 99):.0f} ms "
              f"| {median(h):.1f} ms | {percentile(h, 90):.1f} ms | {max(h):.1f} ms |")
    if "staged" in arms and "reload" in arms:
        print(f"held p50, staged / reload: {median(arms['staged']['held_ms']) / median(arms['reload']['held_ms']):.2f}")
    result = {"config": vars(args), "arms": arms}
    print(f"saved {save(f'swap_pause_{args.backend}_{args.swap_mode}' + (f'_{args.tag}' if args.tag else ''), result)}")


if __name__ == "__main__":
    main()
