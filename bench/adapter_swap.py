"""Adapter swap against full-weight swap on the same engine and model: the time to serve new weights
to new requests, and how long new requests were held back, with generations running during the swap.

A full-weight swap drains the engine (every running generation finishes or is ended at the drain
deadline) and copies the whole state; an adapter swap loads one segment's LoRA adapter and repoints
that segment, while running generations keep the adapter they started with. Both kinds alternate in
one process on one engine (the baseline runs side by side), with `--background` streams generating.

    .venv/bin/python bench/adapter_swap.py [--backend hf|vllm] [--repeats 10] [--background 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from common import default_model, median, percentile, save  # noqa: E402


def make_adapters(model_dir: Path, out: Path, n: int, rank: int) -> list[Path]:
    """n distinct random LoRA adapters (B != 0) saved as peft directories."""
    from liveloop.devtools import random_lora_adapter

    return [random_lora_adapter(model_dir, out / f"a{seed}", seed, rank=rank) for seed in range(n)]


async def background(engine, stop: asyncio.Event, streams: int, max_tokens: int) -> int:
    """`streams` generations back to back (half of them on the segment being swapped) until `stop`."""
    from liveloop.server.engines.base import GenerationRequest, SamplingParams

    done = 0

    async def one(k: int) -> None:
        nonlocal done
        i = 0
        while not stop.is_set():
            segment = "cozy" if k % 2 == 0 else "night"
            request = GenerationRequest(f"bg{k}-{i}", (5, 6, 7, 8, 9), SamplingParams(max_tokens=max_tokens, seed=i), segment)
            async with engine.generate(request) as gen:
                async for _ in gen:
                    pass
            done += 1
            i += 1

    await asyncio.gather(*(one(k) for k in range(streams)))
    return done


async def run(args) -> dict:
    from liveloop.devtools import perturbed_checkpoint
    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.base import create_engine
    from liveloop.transport.weights import CheckpointDir

    model_dir = default_model()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        full = [perturbed_checkpoint(model_dir, tmp / f"w{s}", seed=s) for s in (1, 2)]
        adapters = make_adapters(model_dir, tmp, 2, args.rank)
        config = EngineConfig(backend=args.backend, max_adapters=4, max_lora_rank=max(16, args.rank), checkpoint_dir=str(tmp / "ckpt"))
        engine = create_engine(config, model_dir)
        await engine.start(0)
        await engine.update_adapter("night", CheckpointDir(adapters[0]), 1)
        stop = asyncio.Event()
        load = asyncio.create_task(background(engine, stop, args.background, args.max_tokens))
        await asyncio.sleep(1.0)
        times: dict[str, list[float]] = {"full": [], "adapter": []}
        held: dict[str, list[float]] = {"full": [], "adapter": []}
        version = 10
        for k in range(args.repeats):  # alternate the kinds so drift in machine load hits both alike
            for kind in ("full", "adapter"):
                version += 1
                start = time.perf_counter()
                if kind == "full":
                    h = await engine.update_weights(full[k % 2], version)
                else:
                    h = await engine.update_adapter("cozy", CheckpointDir(adapters[k % 2]), version)
                times[kind].append(time.perf_counter() - start)
                held[kind].append(h)
                await asyncio.sleep(args.gap)
        stop.set()
        generated = await load
        await engine.close()
    return {"times": times, "held": held, "background_generations": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--background", type=int, default=4, help="streams generating during the swaps")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between swaps")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    t, h = out["times"], out["held"]
    print(f"backend {args.backend}, {args.repeats} swaps of each kind, {args.background} streams generating")
    print("| swap | p50 | p90 | new requests held p50 | max |")
    print("|---|---|---|---|---|")
    for kind in ("full", "adapter"):
        print(f"| {kind} | {median(t[kind])*1000:.1f} ms | {percentile(t[kind], 90)*1000:.1f} ms "
              f"| {median(h[kind])*1000:.1f} ms | {max(h[kind])*1000:.1f} ms |")
    print(f"| ratio (adapter / full) | {median(t['adapter'])/median(t['full']):.3f} | | | |")
    result = {"config": vars(args), **out}
    print(f"saved {save(f'adapter_swap_{args.backend}', result)}")
    print(json.dumps({k: median(v) for k, v in t.items()}))


if __name__ == "__main__":
    main()
