"""Serving overhead against the bare engine (issue 36.2): generated tokens/s through liveloop's HTTP
endpoint (auth, chat template, text, SSE, durable logging of every response to SQLite; learner off)
against the same engine driven directly in this process, same prompts, same token counts
(`ignore_eos`), same sampling as a liveloop request (vLLM: `vllm_engine.sampling_params`, logprobs
included; hf: liveloop's own `HFEngine` below the edge).

- `--backend vllm`: the bare AsyncLLM streaming (DELTA outputs) against HTTP streaming, and the bare
  AsyncLLM asked for the final output only (FINAL_ONLY) against HTTP non-streaming;
- `--backend hf`: the bare `HFEngine` (it streams; a whole reply is its stream read to the end)
  against HTTP streaming and non-streaming.

With `--vllm-server` (vLLM only) vLLM's own OpenAI server (bench/vllm_serving.py starts it with the
same engine arguments) runs the same HTTP rounds beside them: what any HTTP server reaches against the
bare engine on this machine, its client included (asked for the sampled token's logprob, as the bare engine is).
With `--hf-thread-arm` (hf only) a second liveloop server whose hf engine runs on a thread of the server's
process (`[engine] hf_worker = "thread"`; the default is a process of its own) runs the same rounds beside.

The HTTP client is aiohttp, as vLLM's own serving benchmark's (httpx's client, used before, was
the bottleneck of its own rounds on this 2-core machine), in this process. Rounds interleave (bare,
then each HTTP mode, in a rotating order) so each ratio compares rounds that saw the same load on the
machine; the ratio reported is the median of the per-round ratios. Both sides are warmed before the
first round (the server by its own start: server/edge/pipeline/readiness.py).

    .venv/bin/python bench/serving_overhead.py [--backend vllm|hf] [--requests 256] [--concurrency 16]
        [--max-tokens 64] [--rounds 5] [--goal 0.9] [--hf-thread-arm]

The last line says PASS when both HTTP modes are at >= --goal of the bare engine, else FAIL.
Results: bench/results/serving_overhead_<backend>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from common import chat_messages, default_model, median, save  # noqa: E402
# vLLM's server is asked for the sampled token's logprob, as the bare engine and liveloop compute it for every token
from vllm_serving import LOGPROBS_BODY, start_vllm  # noqa: E402

PATHS = ("bare", "stream", "non_stream")
VLLM_PATHS = ("vllm_stream", "vllm_non_stream")  # vLLM's own server, --vllm-server
THREAD_PATHS = ("thread_stream", "thread_non_stream")  # liveloop with its hf engine on a thread of its process, --hf-thread-arm


class Bare:
    """The engine the server runs, driven directly: `round(prompts, final_only)` -> (tokens, seconds)."""

    def __init__(self, backend: str, model_dir: Path, args):
        self.backend, self.model_dir, self.args = backend, model_dir, args
        self.engine = None

    async def start(self) -> None:
        from liveloop.server.config import EngineConfig

        if self.backend == "vllm":
            from vllm.v1.engine.async_llm import AsyncLLM

            from liveloop.server.engines.vllm.engine import engine_args

            self.engine = AsyncLLM.from_engine_args(engine_args(EngineConfig(model=str(self.model_dir)), str(self.model_dir)))
        else:
            from liveloop.server.engines.hf.engine import HFEngine

            self.engine = HFEngine(EngineConfig(backend="hf", model=str(self.model_dir)), self.model_dir)
            await self.engine.start()

    async def close(self) -> None:
        if self.backend == "vllm":
            self.engine.shutdown()
        else:
            await self.engine.close()

    async def round(self, prompts: list[list[int]], final_only: bool) -> tuple[int, float]:
        from liveloop.server.engines.base import GenerationRequest, SamplingParams

        sem = asyncio.Semaphore(self.args.concurrency)
        sampling = SamplingParams(max_tokens=self.args.max_tokens)  # ignore_eos: no stop token, each reply its length

        async def one(i: int, ids: list[int]) -> int:
            rid = f"bare-{time.time_ns()}-{i}"
            async with sem:
                if self.backend == "vllm":
                    return await self._vllm(rid, ids, sampling, final_only)
                n = 0
                async with self.engine.generate(GenerationRequest(rid, tuple(ids), sampling)) as gen:
                    async for delta in gen.stream:
                        n += len(delta.token_ids)
                return n

        start = time.perf_counter()
        counts = await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])
        return sum(counts), time.perf_counter() - start

    async def _vllm(self, rid: str, ids: list[int], sampling, final_only: bool) -> int:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from liveloop.server.engines.vllm.engine import sampling_params

        params = sampling_params(sampling)  # a liveloop request's (logprobs, DELTA outputs)
        if final_only:
            params.output_kind = RequestOutputKind.FINAL_ONLY
        n = 0
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(ids)), params, request_id=rid):
            n = len(out.outputs[0].token_ids) if final_only else n + len(out.outputs[0].token_ids)
        return n


async def http_round(session, base_url: str, key: str, n: int, args, stream: bool, extra: dict | None = None) -> tuple[int, float]:
    sem = asyncio.Semaphore(args.concurrency)
    headers = {"Authorization": f"Bearer {key}"}

    async def one(i: int) -> int:
        body = {"model": "liveloop-tiny", "messages": chat_messages(i), "max_tokens": args.max_tokens, "ignore_eos": True, **(extra or {})}
        async with sem:
            if not stream:
                async with session.post(base_url + "/v1/chat/completions", json=body, headers=headers) as r:
                    r.raise_for_status()
                    return (await r.json())["usage"]["completion_tokens"]
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            tokens, tail = 0, b""
            async with session.post(base_url + "/v1/chat/completions", json=body, headers=headers) as r:
                r.raise_for_status()
                async for chunk in r.content.iter_any():
                    tail = (tail + chunk)[-4096:]
            for event in tail.split(b"\n\n"):
                if event.startswith(b"data: {") and b'"usage"' in event:
                    tokens = json.loads(event[6:])["usage"]["completion_tokens"]
            return tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*[one(i) for i in range(n)])
    return sum(counts), time.perf_counter() - start


async def run_side_by_side(model_dir: Path, args) -> dict:
    import aiohttp
    from transformers import AutoTokenizer

    from liveloop.devtools import USER_KEY, start_server

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = [
        tok(tok.apply_chat_template(chat_messages(i), add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
        for i in range(args.requests)
    ]
    out: dict[str, dict] = {p: {"tokens": [], "tokens_per_s": []} for p in PATHS}
    with tempfile.TemporaryDirectory() as tmp:
        server = await asyncio.to_thread(start_server, Path(tmp) / "liveloop", model_dir, args.backend)
        threaded = None
        if args.hf_thread_arm:
            threaded = await asyncio.to_thread(start_server, Path(tmp) / "liveloop_thread", model_dir, "hf",
                                               engine_extra='hf_worker = "thread"\n')
        theirs = None
        if args.vllm_server:
            (Path(tmp) / "vllm").mkdir()
            theirs = await asyncio.to_thread(start_vllm, model_dir, Path(tmp) / "vllm")
        bare = Bare(args.backend, model_dir, args)
        await bare.start()
        connector = aiohttp.TCPConnector(limit=args.concurrency)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

                async def one_round(path: str) -> tuple[int, float]:
                    if path.startswith("bare"):
                        return await bare.round(prompts, final_only=path == "bare_final")
                    url = theirs.base_url if path.startswith("vllm_") else threaded.base_url if path.startswith("thread_") else server.base_url
                    return await http_round(session, url, USER_KEY, args.requests, args, stream=not path.endswith("non_stream"),
                                            extra=LOGPROBS_BODY if path.startswith("vllm_") else None)

                await bare.round(prompts[: 2 * args.concurrency], final_only=False)  # warm-up (the server warmed itself)
                await http_round(session, server.base_url, USER_KEY, args.concurrency, args, stream=True)
                paths = PATHS + (("bare_final",) if args.backend == "vllm" else ()) + (VLLM_PATHS if theirs else ()) + (THREAD_PATHS if threaded else ())
                for path in paths:
                    out.setdefault(path, {"tokens": [], "tokens_per_s": []})
                if theirs:
                    await http_round(session, theirs.base_url, USER_KEY, args.concurrency, args, stream=True, extra=LOGPROBS_BODY)
                if threaded:
                    await http_round(session, threaded.base_url, USER_KEY, args.concurrency, args, stream=True)
                for r in range(args.rounds):
                    for path in paths[r % len(paths):] + paths[: r % len(paths)]:
                        tokens, secs = await one_round(path)
                        out[path]["tokens"].append(tokens)
                        out[path]["tokens_per_s"].append(tokens / secs)
                        print(f"round {r} {path}: {tokens / secs:.0f} tok/s", flush=True)
        finally:
            await bare.close()
            server.stop()
            if theirs:
                theirs.stop()
            if threaded:
                threaded.stop()
    return out


def overhead(model_dir: Path, args) -> dict:
    """One side-by-side run (`args`: backend, requests, concurrency, max_tokens, rounds, vllm_server):
    the rounds, the per-round ratios against the bare engine and their medians (`ratio_<mode>`), printed
    as a table."""
    runs = asyncio.run(run_side_by_side(model_dir, args))
    # streaming against the bare stream; non-streaming against the bare final-only output (vLLM) or the
    # bare stream read whole (hf)
    baseline = {"stream": "bare", "non_stream": "bare_final" if args.backend == "vllm" else "bare"}
    if args.vllm_server:
        baseline |= {"vllm_stream": "bare", "vllm_non_stream": "bare_final"}
    if args.hf_thread_arm:
        baseline |= {"thread_stream": "bare", "thread_non_stream": "bare"}
    ratios = {m: [h / b for h, b in zip(runs[m]["tokens_per_s"], runs[baseline[m]]["tokens_per_s"])] for m in baseline}
    result = {"config": vars(args), "rounds": runs, "ratios_per_round": ratios, **{f"ratio_{m}": median(r) for m, r in ratios.items()}}
    print(f"\n{args.backend}: | path | tokens/s (median) | ratio vs bare (median of rounds) | ratios per round |")
    print("|---|---|---|---|")
    for path in ("bare", "bare_final"):
        if runs.get(path, {}).get("tokens_per_s"):
            print(f"| bare engine{' (final only)' if path == 'bare_final' else ''} | {median(runs[path]['tokens_per_s']):.0f} | 1.00 | |")
    for mode in baseline:
        per_round = " ".join(f"{r:.2f}" for r in ratios[mode])
        who = {"vllm": "vLLM's own server, ", "thread": "liveloop, hf engine on a thread of the server, "}.get(mode.split("_")[0], "liveloop, ")
        what = "non-stream" if mode.endswith("non_stream") else "stream"
        print(f"| {who}HTTP {what}{' + logging' if who.startswith('liveloop') else ''} | {median(runs[mode]['tokens_per_s']):.0f} "
              f"| {median(ratios[mode]):.2f} | {per_round} |")
    return result


def low_modes(result: dict, goal: float) -> dict[str, float]:
    """liveloop's modes under `goal` x the bare engine."""
    return {m: v for m in ("stream", "non_stream") if (v := result[f"ratio_{m}"]) < goal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--goal", type=float, default=0.9)
    parser.add_argument("--vllm-server", action="store_true", help="vLLM's own OpenAI server's HTTP rounds beside")
    parser.add_argument("--hf-thread-arm", action="store_true",
                        help="hf: a second liveloop server beside, its engine on a thread of its process (engine.hf_worker = thread)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = overhead(default_model(), args)
    print(f"saved {save(f'serving_overhead_{args.backend}', result)}")
    low = low_modes(result, args.goal)
    print("PASS" if not low else "FAIL: " + ", ".join(f"{m} at {v:.2f}x the bare engine (goal {args.goal})" for m, v in low.items()))
    sys.exit(1 if low else 0)


if __name__ == "__main__":
    main()
