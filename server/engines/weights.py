"""Weight transport for engines that live in another process: named tensors become a checkpoint
directory (safetensors + the base config) that the engine reloads from disk."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_checkpoint(tensors: Mapping[str, torch.Tensor], base_model: str | Path, root: str | Path) -> Path:
    """Write `tensors` as a loadable checkpoint directory under `root` (atomically); returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"push-{uuid.uuid4().hex[:12]}"
    tmp = root / f".{final.name}.tmp"
    tmp.mkdir()
    state = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    _untie(state)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        src = Path(base_model) / name
        if src.exists():
            shutil.copy(src, tmp / name)
    os.replace(tmp, final)
    return final


def _untie(state: dict[str, torch.Tensor]) -> None:
    # safetensors refuses tensors that share storage (tied embeddings): give each its own copy.
    seen: dict[int, str] = {}
    for name, t in list(state.items()):
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            state[name] = t.clone()
        else:
            seen[ptr] = name
