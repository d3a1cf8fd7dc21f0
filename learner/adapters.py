"""LoRA adapters on one frozen base, for the learner (peft): one named adapter per segment.

    policy = AdapterPolicy(base_model_dir, config.lora)
    policy.add("cozy", adapter_dir)   # a published version's adapter, or None: a fresh one (B = 0: the base exactly)
    with policy.active("cozy"): ...   # forward and backward through the base + cozy's adapter
    with policy.base(): ...           # the base alone: the KL reference, no second copy of the model
    policy.save("cozy", directory)    # a peft `save_pretrained` directory (adapter_config.json + safetensors)

Only the active adapter's parameters take gradients (peft's `set_adapter` marks them); each segment's
optimizer holds its own adapter's parameters (`parameters`), so a step for one segment never moves
another's adapter or the base.

Targets (`[learner.lora]`): `target_modules` name Linear layers (the attention projections, `lm_head`);
`target_parameters` name raw parameters peft wraps with its ParamWrapper (a MoE model's fused experts,
`mlp.experts.gate_up_proj` of shape experts x out x in). `check_targets` refuses at start what the
engines could not serve, so the learner never trains an adapter the server then refuses.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from liveloop.learner.config import LoraSettings
from liveloop.learner.placement import Placement


def lora_config(settings: LoraSettings):  # noqa: ANN201 (a peft LoraConfig)
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, target_modules=list(settings.target_modules),
        target_parameters=list(settings.target_parameters) or None, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
    )


class UnadaptableTargets(ValueError):
    """`[learner.lora] target_modules` or `target_parameters` name modules or parameters the model
    lacks, or that LoRA cannot adapt here."""


def check_targets(model: nn.Module, targets: tuple[str, ...], parameters: tuple[str, ...] = ()) -> None:
    """Every target module names at least one module of `model`, and each is a Linear layer (what the
    engines serve adapters on as modules: the hf engine and vLLM refuse others, e.g. a MoE router or
    the fused experts); every target parameter names at least one 2-D or 3-D parameter held directly
    by a module that is not a Linear or Embedding layer (those are targeted as modules), matched as
    peft matches it (`<module>.<parameter>`, a suffix of the full name). So the learner never trains
    an adapter the server cannot load."""
    modules = dict(model.named_modules())
    absent, odd = [], set()
    for target in targets:
        matched = [m for n, m in modules.items() if n == target or n.endswith("." + target)]
        if not matched:
            absent.append(target)
        odd.update(type(m).__name__ for m in matched if not isinstance(m, nn.Linear))
    problems = []
    if absent:
        problems.append(f"target_modules {absent} are not modules of the model")
    if odd:
        problems.append(f"target_modules name {sorted(odd)} modules, which are not Linear layers "
                        "(a MoE model's fused experts are targeted through target_parameters)")
    problems += _parameter_problems(modules, parameters)
    if problems:
        raise UnadaptableTargets(f"learner.lora: {'; '.join(problems)}")


def _parameter_problems(modules: dict[str, nn.Module], parameters: tuple[str, ...]) -> list[str]:
    owned = {  # "<module>.<parameter>" -> (its module, the parameter), parameters held directly
        f"{n}.{p}" if n else p: (m, t) for n, m in modules.items() for p, t in m.named_parameters(recurse=False)
    }
    absent, odd = [], []
    for target in parameters:
        matched = [(k, m, t) for k, (m, t) in owned.items() if k == target or k.endswith("." + target)]
        if not matched:
            absent.append(target)
        for key, module, tensor in matched:
            if isinstance(module, (nn.Linear, nn.Embedding)):
                odd.append(f"{key} is a {type(module).__name__}'s weight (target the module in target_modules)")
            elif tensor.dim() not in (2, 3):
                odd.append(f"{key} is {tensor.dim()}-D (LoRA adapts 2-D or 3-D parameters)")
    problems = [f"target_parameters {absent} are not parameters of the model"] if absent else []
    return problems + sorted(set(odd))


class AdapterPolicy:
    def __init__(self, base_model_dir: str | Path, settings: LoraSettings, place: Placement | None = None):
        self.settings = settings
        self.place = place or Placement(torch.device("cpu"), torch.float32)
        self.base_model = self.place.load_causal_lm(base_model_dir)
        check_targets(self.base_model, settings.target_modules, settings.target_parameters)
        for p in self.base_model.parameters():
            p.requires_grad_(False)
        self.model: nn.Module | None = None  # the PeftModel, once the first adapter is added
        self._active: str | None = None

    def add(self, name: str, adapter_dir: str | Path | None = None) -> nn.Module:
        """Add (or replace) adapter `name`: loaded from `adapter_dir`, else fresh; returns the model."""
        from peft import PeftModel, get_peft_model

        if self.model is not None and name in self.model.peft_config and len(self.model.peft_config) > 1:
            self.model.delete_adapter(name)  # replaced below (a lane reloading after a rollback)
            self._active = None
        if self.model is None:
            if adapter_dir is None:
                self.model = get_peft_model(self.base_model, lora_config(self.settings), adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.base_model, str(adapter_dir), adapter_name=name, is_trainable=True)
        elif name in self.model.peft_config:  # the only adapter: reload it in place
            self._reset(name, adapter_dir)
        elif adapter_dir is None:
            self.model.add_adapter(name, lora_config(self.settings))
        else:
            self.model.load_adapter(str(adapter_dir), adapter_name=name, is_trainable=True)
        self._use(name)
        return self.model

    def _reset(self, name: str, adapter_dir: str | Path | None) -> None:
        """Reload the model's only adapter (peft cannot delete the last one)."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        if adapter_dir is None:
            for module in self.model.modules():
                if hasattr(module, "reset_lora_parameters"):
                    module.reset_lora_parameters(name, True)
        else:
            set_peft_model_state_dict(self.model, load_peft_weights(str(adapter_dir)), adapter_name=name)

    def parameters(self, name: str) -> list[nn.Parameter]:
        """Adapter `name`'s parameters (what its optimizer steps): `...lora_A.<name>.weight` and the
        like, in Linear layers and ParamWrappers alike (the name must follow a `lora_` part: a segment
        named like a module, `mlp` or `experts`, must not pick up other adapters' matrices)."""
        return [p for n, p in self.model.named_parameters() if _adapter_of(n) == name]

    def _use(self, name: str) -> None:
        if self._active != name:
            self.model.set_adapter(name)
            self._active = name

    @contextlib.contextmanager
    def active(self, name: str) -> Iterator[nn.Module]:
        """The model with adapter `name` on (and trainable)."""
        self._use(name)
        yield self.model

    @contextlib.contextmanager
    def base(self) -> Iterator[nn.Module]:
        """The model with every adapter off: the frozen base."""
        with self.model.disable_adapter():
            yield self.model

    def save(self, name: str, directory: str | Path) -> None:
        """Write adapter `name` as a peft directory at `directory` (adapter_config.json + weights)."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
            # save_embedding_layers: peft would add the whole (tied) lm_head weight once lm_head is a target;
            # an adapter holds its LoRA matrices only (the engines refuse anything else)
            self.model.save_pretrained(tmp, selected_adapters=[name], save_embedding_layers=False)
            saved = Path(tmp) / name if (Path(tmp) / name).is_dir() else Path(tmp)  # peft nests non-"default" names
            shutil.move(str(saved), str(directory))


def _adapter_of(parameter_name: str) -> str | None:
    """The adapter a peft parameter belongs to (`...lora_B.cozy.weight` -> "cozy"), None for the base's."""
    parts = parameter_name.split(".")
    return next((parts[i + 1] for i in range(len(parts) - 1) if parts[i].startswith("lora_")), None)
