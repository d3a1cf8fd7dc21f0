"""peft inside the hf engine's worker thread: `LoraSlots` (the wrapper while any adapter is loaded,
its LoRA layers, and the adapter they compute now: loads that leave the model as it was when they
fail, unloads back to the plain model) and `BaseWeights` (the base weights of a wrapped model under
the plain model's names, for a full-weight swap while adapters are loaded).

An adapter targets Linear (and Embedding) layers by module name, `lm_head` included, and raw
parameters through peft's `target_parameters` (a MoE model's fused experts, `mlp.experts.gate_up_proj`):
peft wraps such a module in one ParamWrapper per parameter, nested (`experts.base_layer` is the next
wrapper); each is a tuner layer like a LoRA Linear, switched per step with the others."""

from __future__ import annotations

from typing import Any

import torch

from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import AdapterUnusable


class LoraSlots:
    """The worker thread's peft state: the model's wrapper (while any adapter is loaded), the LoRA
    layers in it, and the adapter they compute now."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.peft: Any = None  # a peft PeftModel around `model` while any adapter is loaded
        self.layers: list[Any] = []
        self.active: str | None = None

    @property
    def wrapped(self) -> bool:
        return self.peft is not None

    @property
    def names(self) -> set[str]:
        return set(self.peft.peft_config) if self.peft is not None else set()

    def add(self, spec: AdapterSpec, name: str) -> None:
        """Load `spec` as adapter `name`, or raise AdapterUnusable with the model as it was."""
        from peft import LoraConfig, PeftModel

        try:
            config = LoraConfig.from_pretrained(str(spec.path))
            config.inference_mode = True
            _check_targets(self.model, config, spec)
            if self.peft is None:
                self.peft = PeftModel(self.model, config, adapter_name=name)
            loaded = self.peft.load_adapter(str(spec.path), adapter_name=name, is_trainable=False)
            stray = [*loaded.missing_keys, *loaded.unexpected_keys]
            if stray:
                raise AdapterUnusable(f"adapter {spec.path}: its weights do not fit the model ({stray[:3]})")
        except BaseException as exc:
            self._discard(name)
            if isinstance(exc, AdapterUnusable):
                raise
            raise AdapterUnusable(f"adapter {spec.path}: {type(exc).__name__}: {exc}") from exc
        finally:
            self._refresh()

    def drop(self, name: str) -> None:
        if name in self.names:
            self._discard(name)
            self._refresh()

    def activate(self, name: str | None) -> None:
        """Make `name` (None: no adapter) the one every LoRA layer computes."""
        if name == self.active:
            return
        for layer in self.layers:
            layer.set_adapter(name if name is not None else [], inference_mode=True)
        self.active = name

    def _discard(self, name: str) -> None:
        if self.peft is None:
            _strip_lora(self.model)  # a first wrap that failed half-way
        elif len(self.names - {name}) == 0:
            # peft cannot hold zero adapters (a later load fails): unwrap, back to the plain model
            self.peft.unload()
            self.peft = None
            _strip_lora(self.model)
        elif name in self.names:
            if name in self.peft.active_adapters:  # else peft warns that it picks another one itself
                self.peft.set_adapter(next(iter(self.names - {name})), inference_mode=True)
            self.peft.delete_adapter(name)

    def _refresh(self) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer)]
        self.active = _UNKNOWN  # loads and deletes reset layers' active adapters: set them anew


_UNKNOWN: Any = object()
_ADAPTABLE = (torch.nn.Linear, torch.nn.Embedding)


def _check_targets(model: torch.nn.Module, config: Any, spec: AdapterSpec) -> None:
    """Every target module the adapter names is in the model, and is a layer LoRA can adapt; every
    target parameter names a 2-D or 3-D parameter a module of the model holds itself (not a Linear's
    or an Embedding's weight: those are target modules), matched as peft matches it."""
    from peft.tuners.tuners_utils import BaseTunerLayer, check_target_module_exists

    modules = {n: (m.get_base_layer() if isinstance(m, BaseTunerLayer) else m) for n, m in model.named_modules()}
    modules = {n: m for n, m in modules.items() if not _inside_tuner(n)}
    matched = {n: m for n, m in modules.items() if check_target_module_exists(config, n)}
    if isinstance(spec.target_modules, str):
        absent = [] if matched else [spec.target_modules]
    else:
        absent = [t for t in spec.target_modules if not any(n == t or n.endswith("." + t) for n in matched)]
    if absent:
        raise AdapterUnusable(f"adapter {spec.path}: target modules {absent} are not in the model")
    odd = sorted({type(m).__name__ for m in matched.values() if not isinstance(m, _ADAPTABLE)})
    if odd:
        raise AdapterUnusable(f"adapter {spec.path}: targets {odd} modules; LoRA here adapts Linear and Embedding layers")
    _check_parameters(modules, spec)


def _check_parameters(modules: dict[str, torch.nn.Module], spec: AdapterSpec) -> None:
    owned = {f"{n}.{p}" if n else p: (m, t) for n, m in modules.items() for p, t in m.named_parameters(recurse=False)}
    absent, odd = [], set()
    for target in spec.target_parameters:
        matched = [(k, m, t) for k, (m, t) in owned.items() if k == target or k.endswith("." + target)]
        if not matched:
            absent.append(target)
        odd.update(k for k, m, t in matched if isinstance(m, _ADAPTABLE) or t.dim() not in (2, 3))
    if absent:
        raise AdapterUnusable(f"adapter {spec.path}: target parameters {absent} are not in the model")
    if odd:
        raise AdapterUnusable(
            f"adapter {spec.path}: target parameters {sorted(odd)[:3]} are Linear/Embedding weights or not 2-D/3-D; "
            "LoRA here adapts those layers by module name and raw 2-D/3-D parameters (fused experts) by parameter name"
        )


def _inside_tuner(name: str) -> bool:
    # a LoRA layer's own parts (base_layer, lora_A.<adapter>, ...) are not the model's modules
    return any(part == "base_layer" or part.startswith("lora_") for part in name.split("."))


def _strip_lora(model: torch.nn.Module) -> None:
    """Put every LoRA layer's base layer back in its place (what peft's unload does, without a wrapper)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer) and not _inside_tuner(name):  # the outermost of nested ParamWrappers
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())


class BaseWeights:
    """The base weights of a peft-wrapped model under the plain model's names (`...q_proj.weight`
    for `...q_proj.base_layer.weight`), its adapters' tensors left out: what a full-weight swap
    reads and writes while adapters are loaded. The tensors are the model's own (writes land). Nested
    ParamWrappers (`experts.base_layer.base_layer.gate_up_proj`) lose every `base_layer` part."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        from peft.tuners.tuners_utils import BaseTunerLayer

        tuners = [n + "." for n, m in self.model.named_modules() if isinstance(m, BaseTunerLayer) and not _inside_tuner(n)]
        state = {}
        for key, tensor in self.model.state_dict().items():
            owner = next((t for t in tuners if key.startswith(t)), None)
            if owner is None:
                state[key] = tensor
                continue
            rest, nested = key[len(owner) :], 0
            while rest.startswith("base_layer."):
                rest, nested = rest[len("base_layer.") :], nested + 1
            if nested and not _inside_tuner(rest):  # a base tensor, not a (nested wrapper's) LoRA matrix
                state[owner + rest] = tensor
        return state
