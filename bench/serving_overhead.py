"""Serving overhead: generated tokens/s through liveloop's HTTP endpoint (auth, chat template, text,
SSE, durable logging of every response to SQLite) against the bare vLLM AsyncLLM, same requests, same
seeds, same engine arguments, in one script. The bare engine is asked for the same logprobs=1.

Both run side by side and their rounds interleave (bare, non-stream, stream, in a rotating order), so
each ratio compares rounds that saw the same load on the machine; the ratio reported is the median
of the per-round ratios. (On a small shared machine, measuring all bare rounds first and all HTTP
rounds minutes later made the ratio swing from 0.6 to 1.3 between runs.)

    .venv/bin/python bench/serving_overhead.py [--requests 64] [--concurrency 16] [--max-tokens 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from common import chat_messages, default_model, median, save  # noqa: E402


async def bare_round(llm, prompts, args) -> tuple[int, float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sem = asyncio.Semaphore(args.concurrency)

    async def one(i: int, ids: list[int]) -> int:
        async with sem:
            params = SamplingParams(
                max_tokens=args.max_tokens, temperature=1.0, seed=i, logprobs=1, stop_token_ids=args.stop_ids,
                detokenize=False, output_kind=RequestOutputKind.DELTA,
            )
            n = 0
            async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, request_id=f"b{time.time_ns()}-{i}"):
                n += len(out.outputs[0].token_ids)
            return n

    start = time.perf_counter()
    counts = await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])
    return sum(counts), time.perf_counter() - start


async def http_round(base_url: str, key: str, n: int, args, stream: bool) -> tuple[int, float]:
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as client:

        async def one(i: int) -> int:
            body = {"model": "liveloop-tiny", "messages": chat_messages(i), "max_tokens": args.max_tokens, "seed": i}
            async with sem:
                if not stream:
                    r = await client.post("/v1/chat/completions", json=body)
                    r.raise_for_status()
                    return r.json()["usage"]["completion_tokens"]
                body |= {"stream": True, "stream_options": {"include_usage": True}}
                tokens = 0
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if line.startswith("data: {") and '"usage"' in line:
                            usage = json.loads(line[6:]).get("usage")
                            tokens = usage["completion_tokens"] if usage else tokens
                return tokens

        start = time.perf_counter()
        counts = await asyncio.gather(*[one(i) for i in range(n)])
        return sum(counts), time.perf_counter() - start


async def run_side_by_side(model_dir: Path, args) -> dict:
    from transformers import AutoTokenizer
    from vllm.v1.engine.async_llm import AsyncLLM

    from liveloop.devtools import USER_KEY, start_server
    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.vllm_engine import engine_args

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    args.stop_ids = [tok.eos_token_id]
    prompts = [
        tok(tok.apply_chat_template(chat_messages(i), add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
        for i in range(args.requests)
    ]
    paths = ("bare", "non_stream", "stream")
    out: dict[str, dict] = {p: {"tokens": [], "tokens_per_s": []} for p in paths}
    with tempfile.TemporaryDirectory() as tmp:
        server = await asyncio.to_thread(start_server, Path(tmp), model_dir, "vllm")
        llm = AsyncLLM.from_engine_args(engine_args(EngineConfig(model=str(model_dir)), str(model_dir)))
        try:

            async def one_round(path: str) -> tuple[int, float]:
                if path == "bare":
                    return await bare_round(llm, prompts, args)
                return await http_round(server.base_url, USER_KEY, args.requests, args, stream=path == "stream")

            await bare_round(llm, prompts[: args.concurrency], args)  # warm-up
            await http_round(server.base_url, USER_KEY, args.concurrency, args, stream=False)
            await http_round(server.base_url, USER_KEY, args.concurrency, args, stream=True)
            for r in range(args.rounds):
                for path in paths[r % 3 :] + paths[: r % 3]:
                    tokens, secs = await one_round(path)
                    out[path]["tokens"].append(tokens)
                    out[path]["tokens_per_s"].append(tokens / secs)
        finally:
            llm.shutdown()
            server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model_dir = default_model()
    runs = asyncio.run(run_side_by_side(model_dir, args))
    bare = runs["bare"]["tokens_per_s"]
    ratios = {p: [h / b for h, b in zip(runs[p]["tokens_per_s"], bare)] for p in ("non_stream", "stream")}
    result = {
        "config": vars(args) | {"stop_ids": None},
        "bare_tokens_per_s": median(bare),
        "rounds": runs,
        "ratios_per_round": ratios,
        "ratio_non_stream": median(ratios["non_stream"]),
        "ratio_stream": median(ratios["stream"]),
    }
    print("| path | tokens/s (median) | ratio vs bare (median of rounds) | ratios per round | tokens per round |")
    print("|---|---|---|---|---|")
    print(f"| bare AsyncLLM | {median(bare):.0f} | 1.00 | | {runs['bare']['tokens']} |")
    for mode in ("non_stream", "stream"):
        per_round = " ".join(f"{r:.2f}" for r in ratios[mode])
        print(
            f"| HTTP {mode.replace('_', '-')} + logging | {median(runs[mode]['tokens_per_s']):.0f} | {median(ratios[mode]):.2f} "
            f"| {per_round} | {runs[mode]['tokens']} |"
        )
    print(f"saved {save('serving_overhead', result)}")


if __name__ == "__main__":
    main()
