"""The masked-diffusion LM interface: `forward(input_ids) -> logits` over a bidirectional transformer
with a mask token, plus the token ids the sampler and the ELBO need (mask, eos, pad).

The tiny default is a transformers-native `ModernBertForMaskedLM` with a tiny config. Why ModernBERT: it
is an encoder (every position attends to every other one, which a masked diffusion LM requires: it
predicts all masked positions from the whole partially-masked sequence), it is native to transformers (no
remote code, saves/loads with `save_pretrained` / `AutoModelForMaskedLM`), it has rotary positions (no
absolute-position table to outgrow) and an LM head over the vocabulary. With `global_attn_every_n_layers=1`
every layer attends globally, as LLaDA does. A masked LM trained with random mask ratios is exactly a
masked diffusion LM (LLaDA's training objective), so nothing else is needed.

Any Hugging Face checkpoint directory loads through `load_diffusion_model`: native masked LMs via
`AutoModelForMaskedLM`; LLaDA / Dream style checkpoints (custom code, `auto_map` in config.json to
AutoModel or AutoModelForCausalLM, bidirectional despite the name) with `trust_remote_code=True`.
This module knows nothing about sampling or losses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerBase

from liveloop.diffusion.tokenizer import build_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TinyModelConfig:
    """Architecture of the tiny default (about 0.15M parameters with the default sizes)."""

    hidden_size: int = 64
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 128
    max_position_embeddings: int = 256


class MaskedDiffusionLM(nn.Module):
    """A bidirectional masked LM seen as a diffusion LM: `forward(input_ids) -> logits [B, T, V]`.

    `net` is the wrapped Hugging Face module; `mask_id`, `eos_id`, `pad_id` come from the tokenizer
    (or the config for checkpoints whose tokenizer has no mask token, e.g. LLaDA's 126336).
    """

    def __init__(self, net: nn.Module, mask_id: int, eos_id: int, pad_id: int):
        super().__init__()
        self.net = net
        self.mask_id = int(mask_id)
        self.eos_id = int(eos_id)
        self.pad_id = int(pad_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        out = self.net(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        return logits

    def save(self, path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        """`save_pretrained` of the wrapped model (and tokenizer) plus the special ids."""
        path = Path(path)
        self.net.save_pretrained(path, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        (path / SPECIAL_IDS_FILE).write_text(
            json.dumps({"mask_id": self.mask_id, "eos_id": self.eos_id, "pad_id": self.pad_id}) + "\n"
        )


SPECIAL_IDS_FILE = "diffusion_special_ids.json"


def tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> MaskedDiffusionLM:
    """A freshly initialised tiny ModernBERT masked LM over `tokenizer`'s vocabulary (seeded)."""
    torch.manual_seed(seed)
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        global_attn_every_n_layers=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        cls_token_id=tokenizer.eos_token_id,
        sep_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    net = ModernBertForMaskedLM(config)
    return MaskedDiffusionLM(net, tokenizer.mask_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)


def default_tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


def load_diffusion_model(
    path: str | Path, trust_remote_code: bool = False, dtype: str = "float32"
) -> tuple[MaskedDiffusionLM, PreTrainedTokenizerBase]:
    """Load a checkpoint directory as a masked diffusion LM, with its tokenizer.

    The auto class follows the checkpoint: `auto_map` entries (remote code: AutoModelForMaskedLM, else
    AutoModel as LLaDA and Dream declare, else AutoModelForCausalLM), otherwise AutoModelForMaskedLM.
    The mask id is the tokenizer's mask token, else `mask_token_id` in config.json; a checkpoint with
    neither is refused (it cannot be a masked diffusion LM).
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    path = Path(path)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    auto_map = getattr(config, "auto_map", None) or {}
    if "AutoModelForMaskedLM" in auto_map or not auto_map:
        auto = AutoModelForMaskedLM
    elif "AutoModel" in auto_map:
        auto = AutoModel
    elif "AutoModelForCausalLM" in auto_map:
        auto = AutoModelForCausalLM
    else:
        raise ValueError(f"{path}: auto_map {sorted(auto_map)} names no model class usable as a masked LM")
    net = auto.from_pretrained(path, trust_remote_code=trust_remote_code, dtype=_DTYPES[dtype])
    net.eval()
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    ids = _special_ids(path, config, tokenizer)
    return MaskedDiffusionLM(net, **ids), tokenizer


def _special_ids(path: Path, config: Any, tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    saved = path / SPECIAL_IDS_FILE
    if saved.is_file():
        return {k: int(v) for k, v in json.loads(saved.read_text()).items()}
    mask_id = tokenizer.mask_token_id
    if mask_id is None:
        mask_id = getattr(config, "mask_token_id", None)
    if mask_id is None:
        raise ValueError(f"{path}: no mask token (tokenizer.mask_token or config.mask_token_id): "
                         "not a masked diffusion LM")
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else getattr(config, "eos_token_id", None)
    if eos_id is None:
        raise ValueError(f"{path}: no eos token id (tokenizer or config)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    return {"mask_id": int(mask_id), "eos_id": int(eos_id), "pad_id": int(pad_id)}
