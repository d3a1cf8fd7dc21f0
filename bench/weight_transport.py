"""Weight transport: the time for a new version to go live in a running hf engine, per transport
(`checkpoint_dir`: the learner writes safetensors, the engine reads them through transformers' loader;
`shared_memory`: the learner copies tensors into /dev/shm, the engine copies them into its model), for
the tiny default model and a bigger Qwen3-shaped model built here from a config with random weights
(no downloads). `send` is the learner's side (start_update .. finish), `swap` the engine's
(`update_weights`, including the drain and the old weights' backup), `total` both; medians of
--repeats rounds. The sender runs in the bench process: the bytes take the same path as from another
process (the contract tests check a receiver in another process).

    .venv/bin/python bench/weight_transport.py [--models tiny,qwen3-0.6b] [--repeats 3]
    python bench/weight_transport.py --device cuda --models qwen3-0.6b,qwen3-8b --transports shared_memory,ipc --repeats 1

On a GPU (`--device cuda`) the engine and the learner's weights are on the GPU: `shared_memory` copies
them to host shared memory and back, `ipc` hands the engine CUDA IPC views of the learner's tensors (one
copy on the GPU). The bigger shapes are built on the GPU when there is one.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import torch

from common import default_model, median, save  # noqa: E402

# Qwen3-0.6B's shape (0.6B parameters, 1.2 GB in bfloat16, tied embeddings) and Qwen3-8B's (15.3 GiB)
QWEN3_06B = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True, rms_norm_eps=1e-6,
)
QWEN3_8B = dict(
    hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6,
)
SHAPES = {"qwen3-0.6b": QWEN3_06B, "qwen3-8b": QWEN3_8B}


def build_qwen3(out: Path, shape: dict) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**shape, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init is minutes on a CPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    return out


async def measure(model_dir: Path, dtype: str, repeats: int, work: Path, device: str = "cpu",
                  transports: tuple[str, ...] = ("checkpoint_dir", "shared_memory")) -> dict:
    from liveloop.server.config import EngineConfig
    from liveloop.transport.weights import CheckpointDir
    from liveloop.server.engines.hf.engine import HFEngine
    from liveloop.transport import TransportConfig, make_receiver, make_sender
    from liveloop.transport import shared_memory as shm

    engine = HFEngine(EngineConfig(backend="hf", model=str(model_dir), dtype=dtype, device=device), model_dir)
    await engine.start(version=0)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}  # the learner's weights
    size = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in state.values()}.values())
    namespace = "bench" + uuid.uuid4().hex[:8]
    results: dict[str, dict[str, float]] = {}
    version = 0
    try:
        for backend in transports:
            config = TransportConfig(backend=backend, namespace=namespace, keep_versions=1)
            sender = make_sender(config, path_for=lambda v: work / f"v{v:06d}" / "policy", base_model=model_dir)
            receiver = make_receiver(config)
            sends, swaps = [], []
            try:
                for _ in range(repeats):
                    version += 1
                    _sync()
                    start = time.perf_counter()
                    sender.start_update(version)
                    sender.send(state)
                    handle = sender.finish()
                    _sync()
                    sent = time.perf_counter()
                    with receiver.open(handle) as source:
                        await engine.update_weights(source, version)
                    _sync()
                    done = time.perf_counter()
                    receiver.loaded(handle, durable=True)
                    sender.release(version)
                    sends.append(sent - start)
                    swaps.append(done - sent)
                    if isinstance(source, CheckpointDir):
                        import shutil

                        shutil.rmtree(source.path.parent, ignore_errors=True)
            except Exception as exc:  # a backend that cannot run here (ipc without CUDA): say so, go on
                results[backend] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            results[backend] = {"send_s": median(sends), "swap_s": median(swaps), "total_s": median([a + b for a, b in zip(sends, swaps)])}
    finally:
        for v in shm.segments(namespace):
            shm.remove_version(namespace, v)
        await engine.close()
    return {"bytes": size, "dtype": dtype, "transports": results}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--transports", default="checkpoint_dir,shared_memory", help="checkpoint_dir, shared_memory, ipc")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    transports = tuple(args.transports.split(","))
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="weight-transport-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            if name == "tiny":
                model_dir, dtype = default_model(), "float32"
            elif name in SHAPES:
                print(f"building a {name}-shaped model with random weights ...", flush=True)
                model_dir, dtype = build_qwen3(work / name, SHAPES[name]), "bfloat16"
            else:
                raise SystemExit(f"unknown model {name!r} (tiny, {', '.join(SHAPES)})")
            out[name] = asyncio.run(measure(model_dir, dtype, args.repeats, work / f"{name}-ckpt", args.device, transports))
            if name in SHAPES:
                shutil.rmtree(model_dir, ignore_errors=True)
            print(f"{name}: done", flush=True)
    print(f"\n{args.device}: {'model':<12} {'MiB':>8} {'transport':<15} {'send s':>8} {'swap s':>8} {'total s':>8}")
    for name, r in out.items():
        for backend, t in r["transports"].items():
            if "error" in t:
                print(f"{name:<12} {r['bytes'] / 2**20:>8.1f} {backend:<15} failed: {t['error']}")
                continue
            print(f"{name:<12} {r['bytes'] / 2**20:>8.1f} {backend:<15} {t['send_s']:>8.3f} {t['swap_s']:>8.3f} {t['total_s']:>8.3f}")
    for name, r in out.items():
        t = r["transports"]
        if "total_s" in t.get("checkpoint_dir", {}) and "total_s" in t.get("shared_memory", {}):
            print(f"{name}: shared_memory is {t['checkpoint_dir']['total_s'] / t['shared_memory']['total_s']:.1f}x faster end to end")
    print(f"wrote {save(f'weight_transport_{args.device}', {'models': out, 'repeats': args.repeats})}")


if __name__ == "__main__":
    main()
