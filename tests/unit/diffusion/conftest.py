"""A tiny masked diffusion LM for the loss and objective tests."""

from __future__ import annotations

import pytest
import torch

from liveloop.diffusion.model import TinyModelConfig, tiny_model
from liveloop.diffusion.tokenizer import build_tokenizer


@pytest.fixture
def tiny_group():
    """(model, tokenizer, prompt ids [3, P]): a seeded tiny model and one countdown prompt three times."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0)
    prompt = torch.tensor([tok.encode("countdown 3 5 7 = 22\n", add_special_tokens=False)] * 3)
    return model, tok, prompt
