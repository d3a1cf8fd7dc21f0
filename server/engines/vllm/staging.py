"""New weights loaded beside vLLM's serving model while it keeps generating, then copied in during a
pause of about a millisecond: what keeps a vLLM swap from holding requests (runs in vLLM's
engine-core process, under the worker extension, vllm/worker.py).

`StagingJob` (on a thread of its own) fills a shadow of the model: a copy of every module that holds
parameters, each parameter made from the checkpoint-format metadata vLLM recorded at the first load;
vLLM's own `load_weights` fills it, each shadow layer's post-load processing runs, and every
parameter must have been loaded and match the serving one's shape and dtype. `StagingJob.commit`,
with vLLM paused, copies the processed tensors into the serving ones in place and moves the
attributes processing made (GEMM handles) onto the serving layers. A failure while staging leaves
the serving model untouched; it costs a second copy of the weights in host memory.

Where it does not apply (`unsupported`: weights on an accelerator, an unknown quant method, a layer
without load metadata, LoRA layers) the worker reloads as before. Why not `model.load_weights` or
vLLM's `reload_weights`: docs/engines.md, "vLLM swaps staged beside the serving model".
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import torch

log = logging.getLogger(__name__)

_MODULE_STATE = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
_KNOWN_METHODS = frozenset({"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod"})
_MISSING = object()
_checked: weakref.WeakKeyDictionary[torch.nn.Module, str | None] = weakref.WeakKeyDictionary()


class Unstageable(RuntimeError):
    """The model cannot be staged this way (the engine reloads instead); its weights may be fine."""


class WeightsIncomplete(ValueError):
    """The weights give no value for some parameter of the model."""


def unsupported(model: torch.nn.Module) -> str | None:
    """Why `model` cannot be staged (see the module docstring), or None. Decided once per model."""
    if model not in _checked:
        _checked[model] = _why_not(model)
    return _checked[model]


def _why_not(model: torch.nn.Module) -> str | None:
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    from vllm.lora.layers import BaseLayerWithLoRA

    if getattr(model, "_do_torchao_reload", False):
        return "a torchao-quantized model"
    for name, module in model.named_modules():
        if isinstance(module, BaseLayerWithLoRA):
            return f"{name} is a LoRA layer (vLLM's adapters on: not staged yet)"
        own = [p for p in module._parameters.values() if p is not None]
        if not own:
            continue
        if any(p.device.type != "cpu" for p in own):
            return f"{name}'s weights are on {own[0].device} (staging copies them; vLLM's reload is quick there)"
        info = LAYERWISE_INFO.get(module)
        if info is None or not info.restore_metadata[0]:
            return f"vLLM recorded no load metadata for {name} ({type(module).__name__})"
        method = getattr(module, "quant_method", None)
        if method is not None and type(method).__name__ not in _KNOWN_METHODS:
            return f"{name} has quant method {type(method).__name__}"
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if experts is not None and type(experts).__name__ != "CPUUnquantizedExperts":
            return f"{name} runs fused experts {type(experts).__name__}"
    return None


@dataclass
class _Move:
    """What the pause copies into one serving module: (serving, staged) tensor pairs and attributes."""

    live: torch.nn.Module
    tensors: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)


class StagingJob:
    """One swap's weights, staged on a thread (started at once) from `mapped` (a
    worker.MappedWeights, closed once loaded), which rings `ticket` on the bells in directory
    `bell` when done; `commit` copies them into the model while paused."""

    def __init__(self, model: torch.nn.Module, mapped: Any, ticket: int = 0, bell: str | None = None):
        self.model = model
        self._mapped = mapped
        self._ticket, self._bell = ticket, bell
        self._moves: list[_Move] | None = None
        self._shadows: list[torch.nn.Module] = []  # the shadow's modules, taken apart once used (`drop`)
        self.error: str | None = None
        self.fallback = False  # the error is the method's (Unstageable), not the weights'
        self.started = time.perf_counter()
        self.seconds: float | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name="liveloop-staging", daemon=True).start()

    def status(self) -> dict[str, Any]:
        done = self._done.is_set()
        return {"done": done, "error": self.error if done else None, "fallback": self.fallback, "seconds": self.seconds}

    def _run(self) -> None:
        try:
            with torch.no_grad():
                self._moves = _stage(self.model, self._mapped, self._shadows)
        except Unstageable as exc:
            self.error, self.fallback = str(exc), True
        except Exception as exc:  # the weights' fault (a loader refused them): nothing was touched
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._mapped.close()
            if self._moves is None:
                self.drop()
            self.seconds = time.perf_counter() - self.started
            self._done.set()
            if self._bell is not None:
                from pathlib import Path

                from liveloop.transport.bell import ring

                ring(Path(self._bell), json.dumps({"ticket": self._ticket} | self.status()))

    def commit(self) -> dict[str, Any]:
        """Copy the staged weights into the serving model (vLLM paused: no step runs meanwhile)."""
        if not self._done.is_set():
            raise RuntimeError("the staged weights are not ready")
        if self._moves is None:
            raise RuntimeError(f"staging failed: {self.error}")
        start = time.perf_counter()
        with torch.no_grad():
            for move in self._moves:
                for dst, src in move.tensors:
                    dst.data.copy_(src)
                for key, value in move.attrs.items():
                    move.live.__dict__[key] = value
                for key in move.removed:
                    move.live.__dict__.pop(key, None)
        moved = len(self._moves)
        seconds = time.perf_counter() - start
        self.drop()
        return {"modules": moved, "staged_seconds": self.seconds, "commit_seconds": seconds}

    def drop(self) -> None:
        """Take the shadow apart (its modules and tensors refer to each other through bound weight
        loaders): freed now by reference counting, not in a garbage-collector pass that would stall the
        engine's thread at some later step."""
        self._moves = None
        for module in self._shadows:
            module.__dict__.clear()
        self._shadows = []


def _stage(model: torch.nn.Module, mapped: Any, copies: list[torch.nn.Module]) -> list[_Move]:
    """Load `mapped`'s tensors into a shadow of `model` (its modules appended to `copies`), process it,
    and say what the pause copies."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    root, shadows = _shadow(model, copies)
    before = {id(s): dict(s.__dict__) for _, s in shadows}
    loaded = root.load_weights(iter(mapped.tensors))
    mapped.close()  # every tensor is copied into the shadow: let the files' pages go
    _check_complete(root, loaded)
    for live, s in shadows:
        method = getattr(s, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            method.process_weights_after_loading(s)
            experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
            if experts is not None and type(experts).__name__ == "CPUUnquantizedExperts":
                experts.process_weights_after_loading(s)  # the pre-pack a weight update skips (vllm/worker.py)
        if hasattr(s, "update_param_tp_status"):
            s.update_param_tp_status()
    return [_move(live, s, before[id(s)]) for live, s in shadows]


def _shadow(model: torch.nn.Module, copies: list[torch.nn.Module]) -> tuple[torch.nn.Module, list[tuple[torch.nn.Module, torch.nn.Module]]]:
    """A copy of `model`'s modules that hold parameters (and the modules above them; every copy appended
    to `copies`), each parameter a fresh checkpoint-format tensor; tied parameters stay tied. Returns the
    copy's root and the (serving, copy) pairs of the modules with parameters, outermost first."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import SKIP_TENSORS

    made: dict[int, torch.nn.Parameter] = {}
    pairs: list[tuple[torch.nn.Module, torch.nn.Module]] = []

    def carries(m: torch.nn.Module | None) -> bool:
        return m is not None and next(m.parameters(), None) is not None

    def shadow(m: torch.nn.Module) -> torch.nn.Module:
        s = copy.copy(m)  # its own __dict__; the values are the serving module's until replaced
        copies.append(s)
        s._parameters = dict(m._parameters)
        s._buffers = dict(m._buffers)
        s._non_persistent_buffers_set = set(m._non_persistent_buffers_set)
        for key, value in list(s.__dict__.items()):  # methods bound to the serving module act on the copy
            if isinstance(value, MethodType) and value.__self__ is m:
                s.__dict__[key] = value.__func__.__get__(s)
        own = {name: p for name, p in m._parameters.items() if p is not None}
        if own:
            restore = LAYERWISE_INFO[m].restore_metadata[0]
            for name, p in own.items():
                if id(p) not in made:
                    keep = name in SKIP_TENSORS or name not in restore  # never loaded from checkpoints: kept
                    made[id(p)] = _fresh(p if keep else restore[name], m, s, keep)
                s._parameters[name] = made[id(p)]
            pairs.append((m, s))
        s._modules = {name: shadow(c) if carries(c) else c for name, c in m._modules.items()}
        return s

    return shadow(model), pairs


def _fresh(like: torch.Tensor, live: torch.nn.Module, shadow: torch.nn.Module, keep: bool) -> torch.nn.Parameter:
    """A new tensor shaped as `like` (a meta tensor vLLM recorded, or a serving tensor whose values are
    kept: `keep`), with its attributes, the weight loaders unwrapped from a past reload's buffering
    wrappers and bound to `shadow`."""
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor, to_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import layer_ref_sentinel

    t = materialize_meta_tensor(like if like.is_meta else to_meta_tensor(like))
    if keep:
        t.data.copy_(like.data)
    for key, value in list(t.__dict__.items()):
        while getattr(value, "__name__", "") == "online_process_loader":  # vLLM's reload wrapper, left on its metadata
            value = value.__wrapped__
        if isinstance(value, MethodType) and (value.__self__ is live or value.__self__ is layer_ref_sentinel):
            value = value.__func__.__get__(shadow)
        t.__dict__[key] = value
    return t


def _check_complete(root: torch.nn.Module, loaded: Any) -> None:
    """WeightsIncomplete unless every parameter vLLM loads from checkpoints got a value."""
    from vllm.model_executor.model_loader.reload.meta import SKIP_TENSORS

    if loaded is None:
        raise Unstageable("the model's load_weights does not say what it loaded")
    params = dict(root.named_parameters(remove_duplicate=False))
    got = {id(params[name]) for name in loaded if name in params}
    missing = sorted({
        name for name, p in root.named_parameters() if id(p) not in got and name.rsplit(".", 1)[-1] not in SKIP_TENSORS
    })
    if missing:
        raise WeightsIncomplete(f"update_weights: missing tensors {missing[:5]}")


def _move(live: torch.nn.Module, s: torch.nn.Module, before: dict[str, Any]) -> _Move:
    """What to copy into `live` from its processed shadow `s` (`before`: the shadow's attributes before
    loading): every serving tensor's new value (same name, shape and dtype, or Unstageable) and the
    attributes processing set or removed."""
    move = _Move(live)
    for kind in ("_parameters", "_buffers"):
        mine, theirs = getattr(live, kind), getattr(s, kind)
        if {n for n, t in mine.items() if t is not None} != {n for n, t in theirs.items() if t is not None}:
            raise Unstageable(f"{type(live).__name__}: processing changed its {kind[1:]} ({sorted(mine)} -> {sorted(theirs)})")
        for name, dst in mine.items():
            src = theirs[name]
            if dst is None or src is dst:
                continue
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise Unstageable(
                    f"{type(live).__name__}.{name}: staged {tuple(src.shape)} {src.dtype}, serving {tuple(dst.shape)} {dst.dtype}"
                )
            move.tensors.append((dst, src))
    for key, value in s.__dict__.items():
        if key not in _MODULE_STATE and before.get(key, _MISSING) is not value:
            if isinstance(value, MethodType) and value.__self__ is s:
                value = value.__func__.__get__(live)
            move.attrs[key] = value
    move.removed = [key for key in before if key not in s.__dict__ and key not in _MODULE_STATE]
    return move
