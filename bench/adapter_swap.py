"""Adapter swap against full-weight swap on the same engine and model: the time to serve new weights
to new requests, and how long new requests were held back, with generations running during the swap.

A full-weight swap drains the engine (every running generation finishes or is ended at the drain
deadline) and copies the whole state; an adapter swap loads one segment's LoRA adapter and repoints
that segment, while running generations keep the adapter they started with. Both kinds alternate in
one process on one engine (the baseline runs side by side), with `--background` streams generating.

`--per-token` measures instead what serving an adapter costs per generated token, by its targets
(`--targets`): attention (q/k/v/o), experts (attention + the fused MoE experts through peft's
target_parameters) and lm_head (experts + lm_head), one adapter of each loaded at once, against a base
request: `--concurrency` greedy requests of one kind at a time (one batch), the kinds alternating, CPU
time (the process's, the engine's worker thread included) and wall time per token.

    .venv/bin/python bench/adapter_swap.py [--backend hf|vllm] [--repeats 10] [--background 4]
    .venv/bin/python bench/adapter_swap.py --per-token [--targets attention experts lm_head] [--concurrency 1]
        [--repeats 10] [--max-tokens 64]
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


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
TARGETS = {  # name -> (target_modules, target_parameters)
    "attention": (ATTENTION, ()),
    "experts": (ATTENTION, EXPERTS),
    "lm_head": ((*ATTENTION, "lm_head"), EXPERTS),
}


def make_target_adapter(model_dir: Path, out: Path, targets: str, rank: int, seed: int = 0) -> Path:
    """A random LoRA adapter (B != 0) on the modules and parameters `TARGETS[targets]` names."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    modules, parameters = TARGETS[targets]
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(modules),
                        target_parameters=list(parameters) or None, init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(str(out), save_embedding_layers=False)
    return out


async def per_token(args) -> dict:
    """Seconds per generated token (CPU and wall) for a base request and one per adapter target set."""
    import torch

    from liveloop.server.config import EngineConfig
    from liveloop.segments import Lineage
    from liveloop.server.engines.base import GenerationRequest, SamplingParams, create_engine
    from liveloop.transport.weights import CheckpointDir

    torch.set_num_threads(args.threads)
    model_dir = default_model()
    kinds = ["base", *args.targets]
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig(backend=args.backend, max_adapters=len(args.targets) + 1, max_lora_rank=max(16, args.rank),
                              device=args.device, max_model_len=args.max_tokens + 16, max_num_seqs=max(4, args.concurrency))
        engine = create_engine(config, model_dir)
        await engine.start(0)
        for i, targets in enumerate(args.targets):
            adapter = make_target_adapter(model_dir, Path(tmp) / targets, targets, args.rank, seed=i)
            await engine.update_adapter(targets, CheckpointDir(adapter), 1)

        async def stream(request: GenerationRequest) -> int:
            n = 0
            async with engine.generate(request) as gen:
                async for delta in gen:
                    n += len(delta.token_ids)
            return n

        async def one(kind: str, k: int, max_tokens: int) -> tuple[float, float, int]:
            requests = [
                GenerationRequest(f"{kind}-{k}-{j}", (5, 6, 7, 8, 9 + j), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                                  Lineage(None if kind == "base" else kind))
                for j in range(args.concurrency)
            ]
            start_cpu, start = time.process_time(), time.perf_counter()
            n = sum(await asyncio.gather(*(stream(r) for r in requests)))
            return time.process_time() - start_cpu, time.perf_counter() - start, n

        for kind in kinds:  # warm-up
            await one(kind, -1, 4)
        for k in range(args.repeats):
            for kind in kinds[k % len(kinds):] + kinds[: k % len(kinds)]:  # rotate the order: drift hits all alike
                c, w, n = await one(kind, k, args.max_tokens)
                cpu[kind].append(c / n)
                wall[kind].append(w / n)
        await engine.close()
    return {"cpu_per_token": cpu, "wall_per_token": wall}


def print_per_token(args, out: dict) -> None:
    cpu, wall = out["cpu_per_token"], out["wall_per_token"]
    base_cpu = median(cpu["base"])
    print(f"backend {args.backend} on {args.device}, rank {args.rank}, {args.repeats} x {args.concurrency} concurrent requests "
          f"of {args.max_tokens} tokens per kind, {args.threads} thread(s)")
    print("| request | CPU ms/token p50 | p90 | over base | wall ms/token p50 |")
    print("|---|---|---|---|---|")
    for kind in cpu:
        c = median(cpu[kind])
        print(f"| {kind} | {c*1000:.3f} | {percentile(cpu[kind], 90)*1000:.3f} | {(c - base_cpu)*1000:+.3f} ms "
              f"({(c / base_cpu - 1)*100:+.0f}%) | {median(wall[kind])*1000:.3f} |")


async def background(engine, stop: asyncio.Event, streams: int, max_tokens: int) -> int:
    """`streams` generations back to back (half of them on the segment being swapped) until `stop`."""
    from liveloop.segments import Lineage
    from liveloop.server.engines.base import GenerationRequest, SamplingParams

    done = 0

    async def one(k: int) -> None:
        nonlocal done
        i = 0
        while not stop.is_set():
            segment = "cozy" if k % 2 == 0 else "night"
            request = GenerationRequest(f"bg{k}-{i}", (5, 6, 7, 8, 9), SamplingParams(max_tokens=max_tokens, seed=i), Lineage(segment))
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
    parser.add_argument("--per-token", action="store_true", help="measure serving cost per token by adapter targets instead")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS),
                        help="--per-token: the adapters' target sets (attention; + experts; + lm_head)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="--per-token: the engine's device")
    parser.add_argument("--threads", type=int, default=1, help="--per-token: torch threads")
    parser.add_argument("--concurrency", type=int, default=1, help="--per-token: requests of a kind generating together")
    args = parser.parse_args()
    if args.per_token:
        out = asyncio.run(per_token(args))
        print_per_token(args, out)
        name = f"adapter_targets_{args.backend}_{args.device}_c{args.concurrency}"
        print(f"saved {save(name, {'config': vars(args), **out})}")
        return
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
