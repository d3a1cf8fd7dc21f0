"""The weight seam's types and the one way weights go into a model.

- `WeightSource`: what an engine's `update_weights` takes, `CheckpointDir(path)` (a `save_pretrained`
  layout; a plain path means one) or `NamedTensors(mapping)` (tensors in this process, by the served
  model's state_dict names; with a `FileLayout` when they view files another process can map).
  Transports yield them (`liveloop.transport`), engines read them (`liveloop.server.engines`), the
  learner restores from them: the types live here, below all three.
- `load_state`, the one in-place copy every in-process backend uses (with its checks and its
  tied-weight rule), and `write_checkpoint`, which turns named tensors into a checkpoint directory
  (safetensors + the base config) for an engine in another process to reload."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file


@dataclass(frozen=True)
class CheckpointDir:
    """Weights as a checkpoint directory the engine can read (a `save_pretrained` layout)."""

    path: Path


@dataclass(frozen=True)
class MappedFile:
    """A file whose bytes some tensors view: its path, its size, and which file it is (the device and
    inode fstat gave when it was mapped), so that another process mapping the path can check it maps
    the same file, not one put at that path since."""

    path: str
    size: int
    device: int
    inode: int


@dataclass(frozen=True)
class TensorPlace:
    """Where one named tensor's bytes lie: in `FileLayout.files[file]`, `nbytes` from `offset`, row-major."""

    name: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    file: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class FileLayout:
    """Where a source's tensors lie in files a co-located process may map itself rather than be handed
    a copy (the shared_memory transport's files). Valid while the source is open: the files may be
    removed after (a mapping made before keeps its pages)."""

    files: tuple[MappedFile, ...]
    tensors: tuple[TensorPlace, ...]


@dataclass(frozen=True, eq=False)
class NamedTensors:
    """Weights as tensors in this process, by the served model's state_dict names.

    `verified`: their values are known finite, so the engine does not scan them again: the transport
    checked their bytes against the digest recorded when a learner published them (a learner publishes
    only finite weights), or the engine scanned them itself while staging them. Unverified tensors are
    scanned before anything is loaded (engines stage them off the swap's critical section).

    `layout`: where these tensors' bytes lie in files (the shared_memory transport sets it: the tensors
    are views of its mapped files), so an engine in another process maps the same files, checked by
    device and inode, instead of copying the tensors into a file of its own."""

    tensors: Mapping[str, torch.Tensor]
    verified: bool = False
    layout: FileLayout | None = None


WeightSource = CheckpointDir | NamedTensors


def weight_source(weights: str | Path | WeightSource) -> WeightSource:
    """The source `update_weights` was given; a plain path is a checkpoint directory."""
    if isinstance(weights, (CheckpointDir, NamedTensors)):
        return weights
    if isinstance(weights, (str, Path)):
        return CheckpointDir(Path(weights))
    raise TypeError(f"update_weights: expected a checkpoint path, CheckpointDir or NamedTensors, got {type(weights).__name__}")


class WeightsRejected(ValueError):
    """New weights that cannot serve: a tensor of the model is missing, or values are not finite."""


def load_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor], finite: bool = True) -> None:
    """Copy `state` into `module` in place, after checking all of it (`check_state`; WeightsRejected,
    and nothing is copied). `finite=False`: the values are known finite (a verified source), so they
    are not scanned again. Names the module does not have are ignored; values are cast to the
    module's dtypes."""
    check_state(module, state, finite)
    copy_state(module, state)


def check_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor], finite: bool = True) -> None:
    """Raise WeightsRejected unless `state` can be copied into `module` whole: every tensor of the
    module given, each with the module's shape, and (with `finite`) every value finite. What passes
    cannot fail half-way through `copy_state` (a copy into a tensor of the same shape only casts), so a
    swap needs no backup of the old weights.

    Tied weights: names under which the module holds ONE tensor (an LM head tied to the input
    embedding) count as given when any of them is. Each given name is copied in the state's order, so
    if a state gives tied names different values the last one is what serves; a tied model's own
    state always gives them equal."""
    own = module.state_dict()
    given = {_tensor_key(own[k]) for k in state if k in own}
    missing = [k for k, v in own.items() if k not in state and _tensor_key(v) not in given]
    if missing:
        raise WeightsRejected(f"update_weights: missing tensors {missing[:5]}")
    for k, v in state.items():
        if k in own and tuple(v.shape) != tuple(own[k].shape):
            raise WeightsRejected(f"update_weights: {k} has shape {tuple(v.shape)}, the model's is {tuple(own[k].shape)}")
    if finite:
        bad = non_finite(state, names=own)
        if bad is not None:
            raise WeightsRejected(f"update_weights: non-finite values in {bad}")


def copy_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy a state `check_state` passed into `module` in place (casting to its dtypes)."""
    own = module.state_dict()
    with torch.no_grad():
        for k, v in state.items():
            if k in own:
                own[k].copy_(v)


def non_finite(state: Mapping[str, torch.Tensor], names: Mapping[str, object] | None = None) -> str | None:
    """The first floating-point tensor of `state` (among `names`, if given) holding a NaN or an
    infinity, or None."""
    for k, v in state.items():
        if (names is None or k in names) and v.is_floating_point() and not torch.isfinite(v).all():
            return k
    return None


def scanned(source: NamedTensors) -> NamedTensors:
    """`source`'s tensors marked verified once their values are scanned finite (WeightsRejected, naming
    the first bad tensor, if one is not): what an engine does while staging unverified tensors."""
    bad = non_finite(source.tensors)
    if bad is not None:
        raise WeightsRejected(f"update_weights: non-finite values in {bad}")
    return NamedTensors(source.tensors, verified=True, layout=source.layout)


def _tensor_key(t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    # state_dict gives a tied parameter once per name, each a view of the same memory
    return t.data_ptr(), tuple(t.shape)


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


def copy_checkpoint(source: str | Path, root: str | Path) -> Path:
    """Copy the checkpoint directory `source` under `root` (atomically, the same `push-*` naming as
    `write_checkpoint`): for an engine that must keep the directory it was handed after the caller
    removes it. Returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"push-{uuid.uuid4().hex[:12]}"
    tmp = root / f".{final.name}.tmp"
    shutil.copytree(source, tmp, symlinks=False)
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
