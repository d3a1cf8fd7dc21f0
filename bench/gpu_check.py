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
  6. the sglang engine against a real SGLang server, where `sglang` is importable (skipped otherwise):
     `python -m sglang.launch_server` on the 0.6B-shaped model, then the engine contract's steps
     through liveloop's SGLangEngine (`sglang_steps` below): serve v0, swap in a perturbed v1 from disk,
     a refused checkpoint leaves v1 serving, named tensors of v0 serve as v2, a keep swap mid-response
     splits its versions, logprobs against transformers on the same tokens
The limits of 1-5 add up to under 8 minutes; 6 adds up to 5 more (`--sglang-only` runs it alone).

    python bench/gpu_check.py                # on the GPU (through gpu_check.sh)
    python bench/gpu_check.py --sglang-only  # part 6 alone (the model is built first)
    python bench/gpu_check.py --cpu          # the same parts, small, on this machine's CPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    from liveloop.server.engines.hf.engine import HFEngine

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


SGLANG_ARGS = "--disable-radix-cache --disable-cuda-graph --mem-fraction-static 0.3"  # + $SGLANG_ARGS


def sglang_part(model: Path, device: str) -> None:
    """Launch SGLang on `model` on a free port, run `sglang_steps` against it, stop it (its whole process
    group). Radix cache off: liveloop's keep swaps need it; SGLANG_RETURN_ORIGINAL_LOGPROB=1: SGLang then
    reports the raw (temperature-1) logprobs liveloop records."""
    import importlib.util
    import signal
    import socket

    missing = [m for m in ("sglang", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} not importable here", flush=True)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
            "--port", str(port), *SGLANG_ARGS.split(), *os.environ.get("SGLANG_ARGS", "").split()]
    if not any((model / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        argv.append("--skip-tokenizer-init")  # liveloop sends token ids; a random-weight build has no tokenizer
    if device == "cpu":
        argv += ["--device", "cpu"]
    print("$ " + " ".join(argv), flush=True)
    env = {**os.environ, "SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}
    server = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        import httpx

        url = f"http://127.0.0.1:{port}"
        until = time.monotonic() + 180
        while time.monotonic() < until:
            if server.poll() is not None:
                raise SystemExit(f"sglang.launch_server exited with {server.returncode}")
            try:
                if httpx.get(url + "/health", timeout=30, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        else:
            raise SystemExit("sglang did not answer /health within 180 s")
        print(f"sglang up after {time.monotonic() - until + 180:.0f} s", flush=True)
        failures = asyncio.run(sglang_steps(url, model, device))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    if failures:
        raise SystemExit("sglang steps failed: " + "; ".join(failures))


async def sglang_steps(url: str, model: Path, device: str) -> list[str]:
    """The engine contract's steps through liveloop's SGLangEngine against the server at `url`; returns
    what failed (and prints the figures)."""
    import shutil

    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from liveloop.devtools import perturbed_checkpoint
    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.base import GenerationRequest, SamplingParams, create_engine
    from liveloop.transport.weights import NamedTensors

    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"{'ok ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            failures.append(what)

    async def generate(engine, rid: str, tokens: int = 16):
        request = GenerationRequest(rid, prompt, SamplingParams(max_tokens=tokens, temperature=0.0))
        async with engine.generate(request) as gen:
            deltas = [d async for d in gen]
        return gen.version, deltas

    def flat(deltas):
        return [t for d in deltas for t in d.token_ids], [lp for d in deltas for lp in d.logprobs]

    def teacher(checkpoint: Path, ids: list[int]) -> list[float]:
        m = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        m = m.to(device).eval()
        with torch.no_grad():
            lps = torch.log_softmax(m(torch.tensor([list(prompt) + ids], device=device)).logits[0].float(), dim=-1)
        return [float(lps[len(prompt) + t - 1, tok]) for t, tok in enumerate(ids)]

    prompt = tuple(range(10, 26))
    with tempfile.TemporaryDirectory() as tmp:
        v1 = perturbed_checkpoint(model, Path(tmp) / "v1", scale=0.2)
        broken = Path(tmp) / "broken"
        broken.mkdir()
        shutil.copy(model / "config.json", broken / "config.json")
        (broken / "model.safetensors").write_bytes(b"not a safetensors file")
        for mode in ("drain", "keep"):
            config = EngineConfig(backend="sglang", model=str(model), sglang_url=url, swap_mode=mode,
                                  checkpoint_dir=str(Path(tmp) / "pushed"), sglang_health_seconds=1.0)
            engine = create_engine(config, model)
            await engine.start()
            try:
                print(f"\n### swap_mode {mode} (keeps generations: {engine.swap_keeps})", flush=True)
                check(engine.healthy() and engine.version == 0, "started healthy as version 0")
                version, d0 = await generate(engine, f"{mode}-v0")
                ids0, lps0 = flat(d0)
                check(version == 0 and 0 < len(ids0) and all(lp <= 0 for lp in lps0), f"v0 served ({len(ids0)} tokens)")
                diff = max(abs(a - b) for a, b in zip(lps0, teacher(model, ids0)))
                print(f"     |sglang - transformers| logprob max {diff:.4f} over {len(ids0)} tokens", flush=True)
                held = await engine.update_weights(str(v1), 1)
                version, d1 = await generate(engine, f"{mode}-v1")
                check(version == 1 and flat(d1) != (ids0, lps0), f"v1 from disk serves new weights (held {held:.3f} s)")
                try:
                    await engine.update_weights(broken, 2)
                    check(False, "a broken checkpoint is refused")
                except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
                    check(engine.version == 1 and engine.healthy(), f"a broken checkpoint is refused ({type(exc).__name__})")
                version, again = await generate(engine, f"{mode}-v1-again")
                check(version == 1 and flat(again)[0] == flat(d1)[0], "v1 still serves after the refusal")
                state = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).state_dict()
                started = time.monotonic()
                await engine.update_weights(NamedTensors(state), 2)
                version, d2 = await generate(engine, f"{mode}-v2")
                check(version == 2 and flat(d2)[0] == ids0,
                      f"named tensors of v0 serve as v2 (written and loaded in {time.monotonic() - started:.2f} s)")
                if engine.swap_keeps:
                    httpx.post(url + "/slow_down", json={"forward_sleep_time": 0.02}, trust_env=False)
                    request = GenerationRequest("keep", prompt, SamplingParams(max_tokens=64, temperature=0.0))
                    async with engine.generate(request) as gen:
                        stream = gen.__aiter__()
                        deltas = [await anext(stream)]
                        held = await engine.update_weights(str(v1), 3)
                        deltas += [d async for d in stream]
                    httpx.post(url + "/slow_down", json={"forward_sleep_time": None}, trust_env=False)
                    versions = [d.version for d in deltas if d.token_ids]
                    spans = [(v, versions.count(v)) for v in dict.fromkeys(versions)]
                    check(versions == sorted(versions) and versions[0] == 2 and versions[-1] == 3,
                          f"a keep swap mid-response splits it: {spans} (paused {held:.3f} s)")
                    ids, lps = flat(deltas)
                    cut = sum(len(d.token_ids) for d in deltas if d.version == 2)
                    after = teacher(v1, ids)[cut:]
                    diff = max((abs(a - b) for a, b in zip(lps[cut:], after)), default=0.0)
                    print(f"     tokens after the swap against v1 in transformers: logprob max diff {diff:.4f}", flush=True)
            finally:
                await engine.close()
            check(not engine.healthy(), "unhealthy once closed")
    return failures


class _Rollout:
    def __init__(self, prompt, ids, lps):
        self.prompt_ids, self.response_ids, self.logprobs = prompt, ids, lps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="small sizes on the CPU (checks the parts run)")
    parser.add_argument("--sglang-only", action="store_true", help="part 6 alone: the sglang engine against SGLang")
    parser.add_argument("--agreement", nargs=3, metavar=("MODEL", "DEVICE", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--sglang", nargs=2, metavar=("MODEL", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sglang:
        sglang_part(Path(args.sglang[0]), args.sglang[1])
        return
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
        if args.sglang_only:
            part("6. the sglang engine against SGLang", [str(BENCH / "gpu_check.py"), "--sglang", small, device], 300)
            print(f"\n# done in {time.monotonic() - started:.0f} s", flush=True)
            return
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
        part("6. the sglang engine against SGLang", [str(BENCH / "gpu_check.py"), "--sglang", small, device], 300)
    print(f"\n# done in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
