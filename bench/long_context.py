"""Long contexts on the agents preset (issue 45.2): time to first token of a long first prompt (cold) and
of a second request that shares it and adds a few hundred tokens (warm: what an agent CLI's later turn
is), on the engine the preset runs, with vLLM's prefix cache on (the preset) against off (the baseline,
every turn prefilled whole), and the memory each takes.

Each arm runs in a process of its own (its memory is its own): vLLM's AsyncLLM made from liveloop's
engine arguments (`server.engines.vllm.engine.engine_args` of the preset's `[engine]`, `prefix_caching`
set per arm), a prompt of --tokens token ids (repository docs through the model's tokenizer, so no
template), max_tokens 1; TTFT is the time to the first output. Warm is measured --repeats times, each on
its own fresh suffix (a new turn each time), after one cold request. Memory: the process's peak RSS,
its engine core's (vLLM runs it in a child process: RUSAGE_CHILDREN once it has ended), the RSS of both
after the requests, and the KV the prompt holds (its tokens x the KV bytes of one). Ratios: baseline / preset for warm TTFT (higher is better).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/long_context.py [--preset agents] [--tokens 32000]
        [--suffix 300] [--repeats 2] [--arms cache,nocache] [--model DIR --max-model-len N --kv-gb G]
    .venv/bin/python bench/long_context.py --nll models/smollm2-135m-instruct --context 2048 8192 --factors 4
    .venv/bin/python bench/long_context.py --nll models/liveloop-tiny --text corpus --context 512 4096 --factors 8 128

`--nll` instead measures what the YaRN extension costs: the NLL of one window of text under the model as
trained and extended (`nll`). Results: bench/results/long_context.json (long_context_<model>.json with
--model, long_context_nll.json with --nll).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import ROOT, save  # noqa: E402

ARMS = {"cache": True, "nocache": False}  # arm -> engine.prefix_caching


def prompt_ids(model_dir: Path, n: int) -> list[int]:
    """n token ids of repository text (docs, then sources, repeated if need be)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    files = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "liveloop").rglob("*.py"))
    ids: list[int] = []
    while len(ids) < n:
        for f in files:
            ids += tok.encode(f.read_text(), add_special_tokens=False)
            if len(ids) >= n:
                break
    return ids[:n]


def _tree_rss_mb() -> float:
    """RSS of this process and its children (vLLM's engine core, when it runs in a process of its own)."""
    import psutil

    me = psutil.Process()
    return round(sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20, 1)


async def _ttft(llm, ids: list[int], rid: str) -> float:
    from vllm import SamplingParams

    start = time.perf_counter()
    async for _ in llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, temperature=0.0), rid):
        return time.perf_counter() - start
    raise RuntimeError("no output")


async def run_arm(preset: str, prefix_caching: bool, tokens: int, suffix: int, repeats: int,
                  overrides: dict | None = None) -> dict:
    from liveloop.config import load_config
    from liveloop.home import model_path

    cfg = load_config(preset)
    engine = dataclasses.replace(cfg.engine, prefix_caching=prefix_caching, **(overrides or {}))
    model = model_path(engine.model)
    ids = prompt_ids(model, tokens + suffix * (repeats + 1))
    base, tails = ids[:tokens], [ids[tokens + i * suffix: tokens + (i + 1) * suffix] for i in range(repeats + 1)]
    from liveloop.server.engines.vllm.engine import engine_args as args_of
    from vllm.v1.engine.async_llm import AsyncLLM

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(args_of(engine, str(model)))
    started = time.perf_counter() - t0
    try:
        await _ttft(llm, [1, 2, 3], "warmup")  # the engine's first step pays for its own setup
        cold = await _ttft(llm, base + tails[0], "cold")
        warm = [await _ttft(llm, base + tails[0] + tails[i], f"warm{i}") for i in range(1, repeats + 1)]
        kv = llm.vllm_config.cache_config
        tree = _tree_rss_mb()
    finally:
        llm.shutdown()
    hf = json.loads((model / "config.json").read_text())
    kv_bytes_per_token = 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * hf["head_dim"] * 4  # float32
    return {"prefix_caching": prefix_caching, "model": str(model), "max_model_len": engine.max_model_len,
            "prompt_tokens_cold": len(base) + suffix, "prompt_tokens_warm": len(base) + 2 * suffix,
            "engine_start_s": round(started, 2), "ttft_cold_s": round(cold, 3), "ttft_warm_s": [round(w, 3) for w in warm],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "engine_core_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "tree_rss_mb_after": tree,
            "rss_before_engine_mb": round(rss0, 1), "block_size": kv.block_size,
            "kv_mb_of_prompt": round(kv_bytes_per_token * (len(base) + 2 * suffix) / 2**20, 1)}


def nll(model_dir: Path, context: int, factors: list[float], text: str) -> dict:
    """Mean next-token NLL (nats) of one `context`-token window of `text` ("docs": repository docs and
    sources; "corpus": the tiny model's own training distribution, its replies run together) under the
    model as it is and with its RoPE extended by YaRN by each factor, per quarter of the window (a model
    that cannot use far positions gets worse in the later quarters)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from liveloop.model.long_context import trained_length

    torch.set_num_threads(1)
    if text == "corpus":
        from liveloop.model.corpus import generate_corpus

        tok = AutoTokenizer.from_pretrained(model_dir)
        words = " ".join(ex.reply + tok.eos_token for ex in generate_corpus(4000, 12345))
        ids = tok.encode(words, add_special_tokens=False)[:context]
    else:
        ids = prompt_ids(model_dir, context)
    if len(ids) < context:
        raise SystemExit(f"only {len(ids)} tokens of {text}")
    x = torch.tensor([ids])
    rows = {}
    for factor in [1.0] + factors:
        config = AutoConfig.from_pretrained(model_dir)
        trained = trained_length(config.to_dict())
        if factor != 1.0:
            config.rope_parameters = {"rope_type": "yarn", "rope_theta": config.rope_parameters["rope_theta"],
                                      "factor": factor, "original_max_position_embeddings": trained}
            config.max_position_embeddings = int(trained * factor)
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
        start = time.perf_counter()
        with torch.no_grad():
            logits = model(x).logits[0, :-1]
        losses = torch.nn.functional.cross_entropy(logits.float(), x[0, 1:], reduction="none")
        quarters = [round(q.mean().item(), 4) for q in losses.chunk(4)]
        rows[f"yarn x{factor:g}" if factor != 1.0 else "as trained"] = {
            "nll": round(losses.mean().item(), 4), "nll_by_quarter": quarters, "seconds": round(time.perf_counter() - start, 1)}
        print(context, rows, flush=True)
        del model, logits
    return {"model": str(model_dir), "context": context, "trained_positions": trained, "text": text, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="agents")
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--suffix", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--arms", default="cache,nocache")
    ap.add_argument("--arm", help=argparse.SUPPRESS)  # the child: one arm, its result as JSON on stdout's last line
    ap.add_argument("--model", help="engine.model instead of the preset's (e.g. an extended SmolLM2)")
    ap.add_argument("--max-model-len", type=int, help="engine.max_model_len instead of the preset's")
    ap.add_argument("--kv-gb", type=float, help="engine.cpu_kv_cache_gb instead of the preset's")
    ap.add_argument("--nll", type=Path, help="instead: the NLL of a model directory's window (see `nll`)")
    ap.add_argument("--context", type=int, nargs="+", default=[512, 4096], help="--nll: window lengths")
    ap.add_argument("--factors", type=float, nargs="+", default=[128.0], help="--nll: YaRN factors beside none")
    ap.add_argument("--text", choices=["docs", "corpus"], default="docs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.nll:
        result = {"nll": [nll(args.nll, n, args.factors, args.text) for n in args.context]}
        print(f"results: {save('long_context_nll', result, args.nll, args.out)}")
        return 0
    overrides = {k: v for k, v in (("model", args.model), ("max_model_len", args.max_model_len),
                                   ("cpu_kv_cache_gb", args.kv_gb)) if v is not None}
    if args.arm:
        result = asyncio.run(run_arm(args.preset, ARMS[args.arm], args.tokens, args.suffix, args.repeats, overrides))
        print(json.dumps(result))
        return 0
    arms = {}
    for arm in args.arms.split(","):
        cmd = [sys.executable, __file__, "--arm", arm, "--preset", args.preset, "--tokens", str(args.tokens),
               "--suffix", str(args.suffix), "--repeats", str(args.repeats)]
        cmd += [a for k, v in (("--model", args.model), ("--max-model-len", args.max_model_len), ("--kv-gb", args.kv_gb))
                if v is not None for a in (k, str(v))]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            print(out.stderr[-4000:], file=sys.stderr)
            return 1
        arms[arm] = json.loads(out.stdout.strip().splitlines()[-1])
        print(arm, json.dumps(arms[arm]), flush=True)
    result = {"preset": args.preset, "overrides": overrides, "tokens": args.tokens, "suffix": args.suffix, "arms": arms}
    if {"cache", "nocache"} <= arms.keys():
        warm = {a: min(arms[a]["ttft_warm_s"]) for a in ("cache", "nocache")}
        result["ratios"] = {"warm_ttft_nocache_over_cache": round(warm["nocache"] / warm["cache"], 1),
                            "cold_over_warm_with_cache": round(arms["cache"]["ttft_cold_s"] / warm["cache"], 1)}
        print("ratios", json.dumps(result["ratios"]))
    name = "long_context" if not overrides else "long_context_" + Path(args.model or args.preset).name
    path = save(name, result, Path(arms[next(iter(arms))]["model"]), args.out)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
