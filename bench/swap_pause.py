"""Swap pause: request latency (first token and whole response) under steady load while new weights
are hot-swapped every few seconds, against the same load without swaps, in one run on one server;
plus the swap time itself (the admin call) and how long new requests were held back (drain mode: the
drain and the load; keep mode: what the engine's own load held them, vLLM's pause or the hf worker's
copy). The swaps are operator checkpoints (`POST /admin/weights`), read from disk at each swap.

    .venv/bin/python bench/swap_pause.py [--concurrency 8] [--phase-seconds 15] [--swap-every 2] [--backend vllm|hf]
        [--swap-mode drain|keep] [--tag NAME]

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


async def run(args) -> dict:
    from liveloop.devtools import ADMIN_KEY, USER_KEY, perturbed_checkpoint, start_server

    model_dir = default_model()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dirs = [perturbed_checkpoint(model_dir, tmp / f"w{s}", seed=s) for s in (1, 2)]
        server = await asyncio.to_thread(
            start_server, tmp / "server", model_dir, args.backend, engine_extra=f'swap_mode = "{args.swap_mode}"'
        )
        results: dict[str, dict] = {"steady": {"ttft": [], "total": [], "failures": 0}, "swapping": {"ttft": [], "total": [], "failures": 0}}
        swaps: list[dict] = []
        try:
            user = httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120)
            admin = httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120)
            await load_phase(user, 3, args.concurrency, args.max_tokens)  # warm-up
            for _ in range(args.repeats):  # alternate, so drift in machine load hits both alike
                for phase in ("steady", "swapping"):
                    tasks = [load_phase(user, args.phase_seconds, args.concurrency, args.max_tokens)]
                    if phase == "swapping":
                        tasks.append(swapper(admin, dirs, args.swap_every, args.phase_seconds))
                    out = await asyncio.gather(*tasks)
                    for key in ("ttft", "total"):
                        results[phase][key] += out[0][key]
                    results[phase]["failures"] += out[0]["failures"]
                    if phase == "swapping":
                        swaps += out[1]
            await user.aclose()
            await admin.aclose()
        finally:
            server.stop()
    return {"results": results, "swaps": swaps}


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
    parser.add_argument("--tag", default="", help="appended to the result's file name (to keep several runs)")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    res, swaps = out["results"], out["swaps"]
    summary = {}
    for phase, r in res.items():
        summary[phase] = {
            "requests": len(r["total"]),
            "failures": r["failures"],
            "p50_s": percentile(r["total"], 50),
            "p99_s": percentile(r["total"], 99),
            "ttft_p50_s": percentile(r["ttft"], 50),
            "ttft_p99_s": percentile(r["ttft"], 99),
        }
    swap_ms = [s["swap_ms"] for s in swaps]
    held_ms = [s["held_ms"] for s in swaps]
    s, w = summary["steady"], summary["swapping"]
    print("| load | requests | failures | latency p50 | p99 | first token p50 | p99 |")
    print("|---|---|---|---|---|---|---|")
    for name, x in (("no swaps", s), (f"swap every {args.swap_every:g}s", w)):
        print(
            f"| {name} | {x['requests']} | {x['failures']} | {x['p50_s']*1000:.0f} ms | {x['p99_s']*1000:.0f} ms "
            f"| {x['ttft_p50_s']*1000:.0f} ms | {x['ttft_p99_s']*1000:.0f} ms |"
        )
    print(f"| ratio (swaps / none) | | | {w['p50_s']/s['p50_s']:.2f} | {w['p99_s']/s['p99_s']:.2f} "
          f"| {w['ttft_p50_s']/s['ttft_p50_s']:.2f} | {w['ttft_p99_s']/s['ttft_p99_s']:.2f} |")
    print(
        f"swaps: {len(swaps)}; admin call p50 {median(swap_ms):.0f} ms, p99 {percentile(swap_ms, 99):.0f} ms; "
        f"new requests held p50 {median(held_ms):.0f} ms, max {max(held_ms):.0f} ms"
    )
    result = {"config": vars(args), "summary": summary, "swap_ms": swap_ms, "held_ms": held_ms}
    print(f"saved {save(f'swap_pause_{args.backend}_{args.swap_mode}' + (f'_{args.tag}' if args.tag else ''), result)}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
