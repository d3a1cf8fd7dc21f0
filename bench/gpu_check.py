"""The accelerator check's parts, each a subprocess with its own time limit (one that fails or runs
out of time is reported and the others still run); run through bench/gpu_check.sh, which makes the
package importable on a machine with only torch and transformers.

  1. learner ratings/s at batch 1/4/16 (bench/learner_batch.py; SAO with the exact KL anchor, critic,
     K = 2 critic steps, one policy step; a 1.7B-shaped Qwen3 in bfloat16, 64 + 512 tokens)
  2. bfloat16 optimizer state against fp32 master weights (bench/learner_batch.py --precision, 0.6B)
  3. swap time per weight transport into a live hf engine (bench/weight_transport.py)
  4. hf engine tokens/s against `generate` (bench/hf_engine.py, 0.6B, bfloat16)
  5. engine/learner logprob agreement: the hf engine samples, the learner (same device and dtype)
     recomputes the logprobs of the same tokens (`agreement` below)
The limits add up to under 8 minutes.

    python bench/gpu_check.py          # on the GPU (through gpu_check.sh)
    python bench/gpu_check.py --cpu    # the same parts, small, on this machine's CPU
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def part(title: str, argv: list[str], limit: float) -> bool:
    print(f"\n## {title}\n$ {' '.join(argv)}", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        print(_useful(out) + f"\n!! timed out after {limit:.0f} s", flush=True)
        return False
    print(_useful(done.stdout), flush=True)
    if done.returncode:
        print(f"!! exit {done.returncode}\n{done.stderr[-3000:]}", flush=True)
    print(f"({time.monotonic() - started:.0f} s)", flush=True)
    return done.returncode == 0


def _useful(text: str) -> str:
    noise = ("Loading weights", "LOAD REPORT", "MISSING", "Notes:", "Key ", "-----", "score.")
    return "\n".join(line for line in text.splitlines() if line.strip() and not any(n in line for n in noise))


async def agreement(model: Path, device: str, dtype: str, n: int = 8, tokens: int = 64) -> None:
    """Sample n responses with the hf engine, recompute their logprobs with the learner's placement."""
    import torch

    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.placement import placement
    from liveloop.rl.batch import Sample, make_batch, response_log_dists, token_logprobs
    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.base import GenerationRequest, SamplingParams
    from liveloop.server.engines.hf_engine import HFEngine

    engine = HFEngine(EngineConfig(backend="hf", model=str(model), device=device, dtype=dtype, max_model_len=256), model)
    await engine.start()
    g = torch.Generator().manual_seed(0)
    prompts = [tuple(torch.randint(5, 1000, (16,), generator=g).tolist()) for _ in range(n)]

    async def one(i: int, prompt: tuple[int, ...]) -> Sample:
        ids, lps = [], []
        async with engine.generate(GenerationRequest(f"a{i}", prompt, SamplingParams(max_tokens=tokens, seed=i))) as gen:
            async for d in gen:
                ids += d.token_ids
                lps += d.logprobs
        return Sample.from_rollout(_Rollout(prompt, ids, lps), 0.0)

    samples = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    await engine.close()
    place = placement(LearnerConfig(device=device, dtype=dtype))
    policy = place.load_causal_lm(model, trainable=False).eval()
    batch = place.batch(make_batch(samples))
    with torch.no_grad():
        logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        learner = token_logprobs(response_log_dists(logits, batch), batch).float().cpu()
    mask = batch.action_mask.cpu().bool()
    diff = (learner - batch.behavior_logprobs.cpu())[mask].abs()
    ratio = (learner - batch.behavior_logprobs.cpu())[mask].exp()
    print(f"{int(mask.sum())} tokens ({device}, {dtype}): |engine - learner| logprob mean {float(diff.mean()):.5f}, "
          f"max {float(diff.max()):.5f}; ratio in [{float(ratio.min()):.4f}, {float(ratio.max()):.4f}]", flush=True)


class _Rollout:
    def __init__(self, prompt, ids, lps):
        self.prompt_ids, self.response_ids, self.logprobs = prompt, ids, lps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="small sizes on the CPU (checks the parts run)")
    parser.add_argument("--agreement", nargs=3, metavar=("MODEL", "DEVICE", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agreement:
        model, device, dtype = args.agreement
        if device == "cpu":
            import torch

            torch.set_num_threads(1)
        asyncio.run(agreement(Path(model), device, dtype))
        return
    started = time.monotonic()
    import torch

    import liveloop
    import sqlalchemy
    import transformers

    print(f"# liveloop GPU check\ntorch {torch.__version__}, transformers {transformers.__version__}, sqlalchemy "
          f"{sqlalchemy.__version__}, cuda {torch.cuda.is_available()}; liveloop from {Path(liveloop.__file__).parent}", flush=True)
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
    elif not args.cpu:
        sys.exit("no CUDA device: run with --cpu to check the parts on the CPU")
    device, dtype = ("cpu", "float32") if args.cpu else ("cuda", "bfloat16")
    lb = str(BENCH / "learner_batch.py")
    with tempfile.TemporaryDirectory() as tmp:
        if args.cpu:
            small = big = str(ROOT / "models" / "liveloop-tiny")
            learner_args = ["--model", big, "--batches", "1,4,16", "--ratings", "16", "--length", "32"]
        else:
            small, big = f"{tmp}/qwen3-0.6b", f"{tmp}/qwen3-1.7b"
            part("build a 0.6B- and a 1.7B-shaped Qwen3 (random weights, bfloat16)", [lb, "--shape", "0.6b", "--build", small], 40)
            part("", [lb, "--shape", "1.7b", "--build", big], 40)
            learner_args = ["--model", big, "--batches", "1,4,16", "--ratings", "32", "--prompt", "64", "--length", "512"]
        part("1. learner ratings/s against batch size", [lb, "--device", device, *learner_args], 100)
        part("2. bfloat16 optimizer state against fp32 master weights",
             [lb, "--precision", "--device", device, "--model", small, "--length", "64" if args.cpu else "256"], 50)
        transport_args = (["--models", "tiny", "--transports", "checkpoint_dir,shared_memory,ipc"] if args.cpu else
                          ["--models", "qwen3-0.6b,qwen3-8b", "--transports", "shared_memory,ipc", "--repeats", "2"])
        part("3. swap time per weight transport (the memory paths; an 8B-shaped model)",
             [str(BENCH / "weight_transport.py"), "--device", device, *transport_args], 150)
        part("4. hf engine tokens/s against generate",
             [str(BENCH / "hf_engine.py"), "--device", device, "--dtype", dtype, "--model", small, "--swaps", "0" if args.cpu else "6",
              "--out", "hf_engine_gpu" if not args.cpu else "hf_engine_cpu_check"], 50)
        part("5. engine/learner logprob agreement", [str(BENCH / "gpu_check.py"), "--agreement", small, device, dtype], 40)
    print(f"\n# done in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
