"""What tools and structured outputs cost to serve, on a real server per engine (hf, vLLM-CPU), measured
side by side in one run: the same chat requests as four arms, interleaved round by round so that the
machine's load falls on all of them alike.

  plain     no tools, free sampling (the baseline)
  tools     tools offered (rendered into the prompt, every reply read for calls), free sampling
  forced    tool_choice named: the reply is a call under its grammar (constrained decoding)
  json      response_format json_schema: the reply is JSON under its grammar

Each arm: `--concurrency` requests at once through the official `openai` client (streaming off),
`--rounds` rounds; reported: output tokens per second and its ratio to `plain`. The free arms ignore
the end-of-sequence token and the constrained ones write a string that runs to max_tokens, so every
arm writes about `--max-tokens` a reply; the prompts differ (offered tools make it longer), so
`--concurrency 1` also reports seconds per output token, whose ratio to plain's is constrained
decoding's cost per token (the grammar's mask each step, on the engine's side). Every response is logged (the learner is off, as it is not what is
measured).

    .venv/bin/python bench/tool_overhead.py --engines hf vllm --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import chat_messages, default_model, save  # noqa: E402

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Look something up.", "parameters": SCHEMA}}]
ARMS = {  # free arms ignore the end of sequence: every arm writes about max_tokens (a string runs on under a grammar)
    "plain": {"extra_body": {"ignore_eos": True}},
    "tools": {"tools": TOOLS, "extra_body": {"ignore_eos": True}},
    "forced": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "search"}}},
    "json": {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}},
}


def one(client, i: int, arm: str, max_tokens: int) -> tuple[int, float]:
    started = time.perf_counter()
    r = client.chat.completions.create(model="liveloop-tiny", messages=chat_messages(i), max_tokens=max_tokens, seed=i, **ARMS[arm])
    return r.usage.completion_tokens, time.perf_counter() - started


def measure(base_url: str, rounds: int, concurrency: int, max_tokens: int) -> dict:
    import openai

    from liveloop.devtools import USER_KEY

    client = openai.OpenAI(base_url=base_url + "/v1", api_key=USER_KEY, max_retries=0)
    tokens = {a: 0 for a in ARMS}
    seconds = {a: 0.0 for a in ARMS}
    per_token = {a: [] for a in ARMS}
    with ThreadPoolExecutor(concurrency) as pool:
        for arm in ARMS:  # warm-up: the grammars compiled, the engine's first steps
            list(pool.map(lambda i: one(client, i, arm, max_tokens), range(concurrency)))
        for r in range(rounds):
            order = list(ARMS)[r % len(ARMS):] + list(ARMS)[: r % len(ARMS)]  # each arm first once in a while
            for arm in order:
                started = time.perf_counter()
                done = list(pool.map(lambda i: one(client, r * concurrency + i, arm, max_tokens), range(concurrency)))
                seconds[arm] += time.perf_counter() - started
                tokens[arm] += sum(n for n, _ in done)
                per_token[arm] += [t / n for n, t in done if n]
    out = {}
    for arm in ARMS:
        tps = tokens[arm] / seconds[arm]
        out[arm] = {"tokens": tokens[arm], "seconds": round(seconds[arm], 2), "tok_s": round(tps, 1),
                    "ratio_to_plain": round(tps / (tokens["plain"] / seconds["plain"]), 3),
                    "ms_per_token_median": round(1000 * statistics.median(per_token[arm]), 2),
                    "ms_per_token_ratio": round(statistics.median(per_token[arm]) / statistics.median(per_token["plain"]), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default="tool_overhead")
    args = ap.parse_args()
    from liveloop import devtools

    model = default_model()
    result: dict = {"rounds": args.rounds, "max_tokens": args.max_tokens, "engines": {}}
    for engine in args.engines:
        with tempfile.TemporaryDirectory() as tmp:
            server = devtools.start_server(Path(tmp), model, engine, learner=None)
            try:
                result["engines"][engine] = {f"c{c}": measure(server.base_url, args.rounds, c, args.max_tokens) for c in args.concurrency}
            except Exception:
                print(server.log_tail(), file=sys.stderr)
                raise
            finally:
                server.stop()
        for c, arms in result["engines"][engine].items():
            for arm, m in arms.items():
                print(f"{engine:5s} {c:4s} {arm:7s} {m['tok_s']:8.1f} tok/s  x{m['ratio_to_plain']:.3f}  "
                      f"{m['ms_per_token_median']:6.2f} ms/token  x{m['ms_per_token_ratio']:.3f}", flush=True)
    print(save(args.out, result, model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
