"""LoRA adapters on one frozen base, for the learner (peft): one named adapter per segment.

    policy = AdapterPolicy(base_model_dir, config.lora)
    policy.add("cozy", adapter_dir)   # a published version's adapter, or None: a fresh one (B = 0: the base exactly)
    with policy.active("cozy"): ...   # forward and backward through the base + cozy's adapter
    with policy.base(): ...           # the base alone: the KL reference, no second copy of the model
    policy.save("cozy", directory)    # a peft `save_pretrained` directory (adapter_config.json + safetensors)

Only the active adapter's parameters take gradients (peft's `set_adapter` marks them); each segment's
optimizer holds its own adapter's parameters (`parameters`), so a step for one segment never moves
another's adapter or the base.
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
        r=settings.rank, lora_alpha=settings.alpha, target_modules=list(settings.target_modules), lora_dropout=0.0,
        bias="none", task_type="CAUSAL_LM",
    )


class UnadaptableTargets(ValueError):
    """`[learner.lora] target_modules` names modules the model lacks or that LoRA cannot adapt here."""


def check_targets(model: nn.Module, targets: tuple[str, ...]) -> None:
    """Every target names at least one module of `model`, and each is a Linear layer (what the
    engines serve adapters on: the hf engine and vLLM refuse others, e.g. a MoE router or the fused
    experts), so the learner never trains an adapter the server cannot load."""
    modules = dict(model.named_modules())
    absent, odd = [], set()
    for target in targets:
        matched = [m for n, m in modules.items() if n == target or n.endswith("." + target)]
        if not matched:
            absent.append(target)
        odd.update(type(m).__name__ for m in matched if not isinstance(m, nn.Linear))
    if absent or odd:
        raise UnadaptableTargets(
            f"learner.lora.target_modules: {f'{absent} are not modules of the model' if absent else ''}"
            f"{'; ' if absent and odd else ''}{f'{sorted(odd)} are not Linear layers' if odd else ''}"
        )


class AdapterPolicy:
    def __init__(self, base_model_dir: str | Path, settings: LoraSettings, place: Placement | None = None):
        self.settings = settings
        self.place = place or Placement(torch.device("cpu"), torch.float32)
        self.base_model = self.place.load_causal_lm(base_model_dir)
        check_targets(self.base_model, settings.target_modules)
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
        """Adapter `name`'s parameters (what its optimizer steps)."""
        marker = f".{name}."
        return [p for n, p in self.model.named_parameters() if marker in n and "lora_" in n]

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
            self.model.save_pretrained(tmp, selected_adapters=[name])
            saved = Path(tmp) / name if (Path(tmp) / name).is_dir() else Path(tmp)  # peft nests non-"default" names
            shutil.move(str(saved), str(directory))
