"""The token-level value model: the policy's transformer with a scalar head per token, attention frozen.

V(s_t) for response token t is read at the position of the token before it (the state the token was
chosen in), aligned like the policy's logprobs. Frozen attention: every attention parameter
(q/k/v/o projections and their norms) has requires_grad=False; MLP / MoE experts, router, final norm
and the value head train (SAO: critic instability came from attention layers).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

ATTENTION_MARKERS = ("self_attn.",)


def build_value_model(policy_dir: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The policy checkpoint with a fresh scalar head (`AutoModelForTokenClassification`, 1 label)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(str(policy_dir))
    config.num_labels = 1
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(str(policy_dir), config=config, dtype=dtype)
    return model


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
