"""The batched `hf` engine against transformers' `generate` on the same prompts, and against stepping
each request on its own (the engine's former loop: one forward per request per token, a KV cache
each), at N concurrent requests; then, if asked, keep against drain swaps: the first-token latency of
new requests that arrive while a swap is made under running generations.

Every run is greedy with the same max_tokens and no stop token, so each request yields exactly
max_tokens tokens; tokens/s counts generated tokens over wall time (prefill included). `generate`
gets all N prompts as one left-padded batch (its best case: nobody joins or leaves). The engine gets
N concurrent requests through its public API.

    .venv/bin/python bench/hf_engine.py [--device cpu|cuda] [--dtype float32|bfloat16]
        [--concurrency 1 4 16] [--max-tokens 64] [--swaps 6] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import torch
from common import default_model, median, percentile, save  # noqa: E402

PROMPT_LEN = 16


def prompts(n: int, vocab: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(0)
    return [tuple(torch.randint(5, vocab, (PROMPT_LEN,), generator=g).tolist()) for _ in range(n)]


def engine_config(args, **kw):
    from liveloop.server.config import EngineConfig

    return EngineConfig(backend="hf", model=str(args.model), device=args.device, dtype=args.dtype,
                        max_num_seqs=max(args.concurrency), max_model_len=PROMPT_LEN + args.max_tokens + 8, **kw)


def request(i: int, prompt: tuple[int, ...], max_tokens: int):
    from liveloop.server.engines.base import GenerationRequest, SamplingParams

    return GenerationRequest(f"b{i}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))


async def drain_stream(engine, req) -> list[int]:
    ids: list[int] = []
    async with engine.generate(req) as gen:
        async for d in gen:
            ids += d.token_ids
    return ids


async def bench_engine(args, batch: list[tuple[int, ...]]) -> tuple[float, list[list[int]]]:
    from liveloop.server.engines.hf.engine import HFEngine

    engine = HFEngine(engine_config(args), args.model)
    await engine.start()
    try:
        await drain_stream(engine, request(-1, batch[0], 4))  # warm-up
        started = time.perf_counter()
        outs = await asyncio.gather(*(drain_stream(engine, request(i, p, args.max_tokens)) for i, p in enumerate(batch)))
        wall = time.perf_counter() - started
    finally:
        await engine.close()
    return sum(map(len, outs)) / wall, outs


@torch.no_grad()
def bench_generate(model, batch: list[tuple[int, ...]], max_tokens: int, device) -> tuple[float, list[list[int]]]:
    width = max(map(len, batch))
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    # no end-of-sequence token, like the engine's requests: every row runs max_tokens (min_new_tokens
    # would instead suppress the EOS logit and change the greedy choice)
    kw = dict(attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0, eos_token_id=[])
    model.generate(ids[:1], **{**kw, "attention_mask": mask[:1], "max_new_tokens": 4})  # warm-up
    _sync(device)
    started = time.perf_counter()
    out = model.generate(ids, **kw)
    _sync(device)
    wall = time.perf_counter() - started
    gen = out[:, width:].tolist()
    return sum(map(len, gen)) / wall, gen


@torch.no_grad()
def bench_per_request(model, batch: list[tuple[int, ...]], max_tokens: int, device) -> float:
    """The former engine loop: round robin, one forward per request per token, each its own cache."""
    states = []
    started = time.perf_counter()
    for p in batch:
        out = model(input_ids=torch.tensor([p], device=device), use_cache=True)
        states.append([out.past_key_values, int(out.logits[0, -1].argmax()), 1])
    while any(s[2] < max_tokens for s in states):
        for s in states:
            if s[2] >= max_tokens:
                continue
            out = model(input_ids=torch.tensor([[s[1]]], device=device), past_key_values=s[0], use_cache=True)
            s[0], s[1], s[2] = out.past_key_values, int(out.logits[0, -1].argmax()), s[2] + 1
    _sync(device)
    return len(batch) * max_tokens / (time.perf_counter() - started)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


async def bench_swaps(args, mode: str, state: dict[str, torch.Tensor]) -> dict:
    """First-token latency of new requests: while a swap is made under `args.concurrency[-1] // 2`
    long generations, and with none (the baseline), in `mode`."""
    from liveloop.transport.weights import NamedTensors
    from liveloop.server.engines.hf.engine import HFEngine

    engine = HFEngine(engine_config(args, swap_mode=mode, drain_deadline_seconds=60.0), args.model)
    await engine.start()
    batch = prompts(max(args.concurrency), engine.model.config.vocab_size)

    async def first_token(i: int) -> float:
        t0 = time.perf_counter()
        async with engine.generate(request(1000 + i, batch[0], 2)) as gen:
            async for _ in gen:
                return time.perf_counter() - t0
        return float("nan")

    try:
        quiet, swapping, held = [], [], []
        for k in range(args.swaps):
            running = [asyncio.create_task(drain_stream(engine, request(i, p, args.max_tokens)))
                       for i, p in enumerate(batch[: max(1, max(args.concurrency) // 2)])]
            await asyncio.sleep(0.05)
            quiet.append(await first_token(k))
            swap = asyncio.create_task(engine.update_weights(NamedTensors(state), k + 1))
            await asyncio.sleep(0)  # the swap has closed the gate: the new request arrives during it
            swapping.append(await first_token(k))
            held.append(await swap)
            await asyncio.gather(*running)
    finally:
        await engine.close()
    return {
        "first_token_p50_s": median(quiet), "first_token_p50_swapping_s": median(swapping),
        "first_token_p99_swapping_s": percentile(swapping, 99), "held_p50_s": median(held),
        "ratio_p50": median(swapping) / median(quiet),
    }


async def main(args) -> dict:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=getattr(torch, args.dtype)).to(args.device).eval()
    rows = []
    for n in args.concurrency:
        batch = prompts(n, model.config.vocab_size)
        engine_tps, engine_out = await bench_engine(args, batch)
        gen_tps, gen_out = bench_generate(model, batch, args.max_tokens, args.device)
        old_tps = bench_per_request(model, batch, args.max_tokens, args.device) if not args.skip_per_request else None
        same = sum(a == b for a, b in zip(engine_out, gen_out)) / n
        rows.append({"concurrency": n, "engine_tokens_per_s": engine_tps, "generate_tokens_per_s": gen_tps,
                     "per_request_tokens_per_s": old_tps, "engine_over_generate": engine_tps / gen_tps,
                     "greedy_outputs_equal_generate": same})
    result = {"device": args.device, "dtype": args.dtype, "model": str(args.model), "max_tokens": args.max_tokens,
              "prompt_len": PROMPT_LEN, "rows": rows}
    if args.swaps:
        state = {k: v.detach().clone() * 1.001 for k, v in model.state_dict().items()}
        result["swaps"] = {mode: await bench_swaps(args, mode, state) for mode in ("drain", "keep")}
    return result


def report(result: dict) -> None:
    print(f"hf engine vs generate ({result['device']}, {result['dtype']}, {result['max_tokens']} tokens, greedy)")
    print(f"{'N':>4} {'engine tok/s':>13} {'generate tok/s':>15} {'per-request tok/s':>18} {'engine/generate':>16} {'same as generate':>17}")
    for r in result["rows"]:
        old = f"{r['per_request_tokens_per_s']:.0f}" if r["per_request_tokens_per_s"] else "-"
        print(f"{r['concurrency']:>4} {r['engine_tokens_per_s']:>13.0f} {r['generate_tokens_per_s']:>15.0f} {old:>18} "
              f"{r['engine_over_generate']:>16.2f} {r['greedy_outputs_equal_generate']:>17.2f}")
    for mode, s in result.get("swaps", {}).items():
        print(f"swap {mode:>5}: first token p50 {s['first_token_p50_s'] * 1e3:.1f} ms quiet, "
              f"{s['first_token_p50_swapping_s'] * 1e3:.1f} ms while swapping ({s['ratio_p50']:.1f}x), "
              f"held p50 {s['held_p50_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--swaps", type=int, default=6, help="keep-vs-drain swaps per mode (0: skip)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-per-request", action="store_true")
    parser.add_argument("--out", default="hf_engine", help="results file name under bench/results")
    args = parser.parse_args()
    args.model = args.model or default_model()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    res = asyncio.run(main(args))
    report(res)
    print(save(args.out, res))
