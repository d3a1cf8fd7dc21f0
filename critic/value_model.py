"""The token-level value model: the policy's transformer with a scalar head per token, attention frozen.

V(s_t) for response token t is read at the position of the token before it (the state the token was
chosen in), aligned like the policy's logprobs. Frozen attention: every attention parameter
(q/k/v/o projections and their norms) has requires_grad=False; MLP / MoE experts, router, final norm
and the value head train (SAO: critic instability came from attention layers). With `[critic] lora_rank`
> 0 only a LoRA adapter on the MLP projections and the value head train (peft), and the frozen weights
can be another module's tensors (`share_frozen`: the learner's base, so a real model is held once); such
a critic is saved as a peft adapter directory and loaded back over its base.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

ATTENTION_MARKERS = ("self_attn.",)


MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")  # a dense model's MLP (llama, Qwen3); a MoE's experts are not Linear


def build_value_model(
    backbone: str | Path, dtype: torch.dtype = torch.float32, lora_rank: int = 0, base_dir: str | Path | None = None,
    share: nn.Module | None = None,
) -> nn.Module:
    """The critic: `backbone` (a model's or a whole critic's checkpoint) with a fresh scalar head
    (`AutoModelForTokenClassification`, 1 label), or a LoRA critic's adapter directory over `base_dir`.
    `lora_rank` > 0 wraps a fresh one in a LoRA adapter on the MLP projections (the head trains too).
    `share`: a module holding the same frozen weights (the learner's base); a LoRA critic's frozen
    tensors become its tensors (`share_frozen`), so the model is not held twice."""
    adapter = (Path(backbone) / "adapter_config.json").is_file()
    if adapter and base_dir is None:
        raise ValueError(f"{backbone} is a LoRA critic: its base model directory is needed to load it")
    model = _token_classifier(base_dir if adapter else backbone, dtype)
    if share is not None and (adapter or lora_rank > 0):
        share_frozen(model, share)
    if adapter:
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(backbone), is_trainable=True)
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        targets = [t for t in MLP_TARGETS if any(n.endswith("." + t) for n, _ in model.named_modules())]
        if not targets:
            raise ValueError("critic.lora_rank > 0 needs MLP projections (gate_proj, up_proj, down_proj) to adapt")
        config = LoraConfig(r=lora_rank, lora_alpha=2.0 * lora_rank, target_modules=targets, modules_to_save=["score"],
                            lora_dropout=0.0, bias="none")
        return get_peft_model(model, config)
    return model


def _token_classifier(model_dir: str | Path, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(str(model_dir))
    config.num_labels = 1
    config.classifier_dropout = 0.0
    return AutoModelForTokenClassification.from_pretrained(str(model_dir), config=config, dtype=dtype)


def _plain_name(name: str) -> str:
    """A parameter's name without what peft adds (`base_model.model.` in front, `.base_layer` inside)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def share_frozen(model: nn.Module, source: nn.Module) -> int:
    """Make `model`'s transformer weights `source`'s tensors (the same storage, frozen) wherever both have
    the parameter under the same name (`model.layers.0.mlp.up_proj.weight`) with the same shape and
    dtype; the copies `model` loaded are freed. Returns the bytes no longer held twice."""
    theirs = {_plain_name(n): p for n, p in source.named_parameters() if "lora_" not in n and "modules_to_save" not in n}
    saved = 0
    for name, param in model.named_parameters():
        other = theirs.get(_plain_name(name))
        if other is None or other.shape != param.shape or other.dtype != param.dtype or name.startswith("score."):
            continue
        param.requires_grad_(False)
        param.data = other.data
        saved += param.numel() * param.element_size()
    return saved


def freeze_attention(model: nn.Module) -> list[str]:
    """Freeze every attention parameter; returns their names."""
    frozen = []
    for name, param in model.named_parameters():
        if any(marker in name for marker in ATTENTION_MARKERS):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


def has_dropout(model: nn.Module) -> bool:
    """Whether a forward in training mode drops units: a dropout module, or a dropout probability in the
    config (attention_dropout, hidden_dropout, ..., functional in the attention code), above 0."""
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = vars(config).items() if config is not None else ()
    return any(("dropout" in k or k.endswith("pdrop")) and isinstance(v, (int, float)) and v > 0 for k, v in rates)


def token_values(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_lengths: list[int], width: int) -> Tensor:
    """Values of the response tokens, [B, width]: row b holds V at positions p_b - 1 ... p_b - 1 + width - 1
    where p_b is sample b's prompt length (right-padded batch)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[..., 0]  # [B, L]; no KV cache to fill
    rows = []
    for b, p in enumerate(prompt_lengths):
        seg = out[b, p - 1 : p - 1 + width]
        if seg.shape[0] < width:
            seg = torch.cat([seg, seg.new_zeros(width - seg.shape[0])])
        rows.append(seg)
    return torch.stack(rows)
