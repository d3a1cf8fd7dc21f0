"""The masked-diffusion model interface: the tiny default is bidirectional, saves and loads through
AutoModelForMaskedLM with its special ids, and an LLaDA-style remote-code checkpoint loads too."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from liveloop.diffusion.model import TinyModelConfig, load_diffusion_model, tiny_model
from liveloop.diffusion.tokenizer import build_tokenizer


def test_tiny_model_is_bidirectional_and_round_trips(tmp_path):
    tok = build_tokenizer()
    model = tiny_model(TinyModelConfig(), tok, seed=0).eval()
    assert (model.mask_id, model.eos_id, model.pad_id) == (tok.mask_token_id, tok.eos_token_id, tok.pad_token_id)
    x = torch.tensor([tok.encode("countdown 3 5 7 = 22\n", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(x)
        y = x.clone()
        y[0, -1] = tok.mask_token_id  # change only the LAST token
        changed = model(y)
    assert logits.shape == (1, x.shape[1], len(tok))
    # a causal model could not see the last token from position 0; a bidirectional one does
    assert not torch.allclose(logits[0, 0], changed[0, 0])
    model.save(tmp_path / "m", tok)
    loaded, tok2 = load_diffusion_model(tmp_path / "m")
    assert type(loaded.net).__name__ == "ModernBertForMaskedLM"
    assert (loaded.mask_id, loaded.eos_id) == (model.mask_id, model.eos_id)
    assert tok2.encode("<answer>12</answer>", add_special_tokens=False) == tok.encode(
        "<answer>12</answer>", add_special_tokens=False)
    with torch.no_grad():
        assert torch.allclose(loaded(x), logits, atol=1e-5)


_CONFIG_PY = '''
from transformers import PretrainedConfig

class TinyLladaConfig(PretrainedConfig):
    model_type = "tiny_llada"

    def __init__(self, vocab_size=58, hidden_size=16, mask_token_id=2, **kw):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.mask_token_id = mask_token_id
        super().__init__(**kw)
'''

_MODELING_PY = '''
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput
from .configuration_tiny_llada import TinyLladaConfig

class TinyLladaModelLM(PreTrainedModel):
    """LLaDA-style: registered as AutoModel, bidirectional (one mean-pooled mixing step)."""
    config_class = TinyLladaConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, **kw):
        h = self.embed(input_ids)
        h = h + h.mean(dim=1, keepdim=True)  # every position sees every other one
        return CausalLMOutput(logits=self.head(h))
'''


def test_remote_code_checkpoint_loads_with_trust_remote_code(tmp_path):
    from transformers import AutoConfig, AutoModel

    d = tmp_path / "llada_like"
    d.mkdir()
    (d / "configuration_tiny_llada.py").write_text(textwrap.dedent(_CONFIG_PY))
    (d / "modeling_tiny_llada.py").write_text(textwrap.dedent(_MODELING_PY))
    (d / "config.json").write_text(json.dumps({
        "model_type": "tiny_llada", "vocab_size": 58, "hidden_size": 16, "mask_token_id": 2, "eos_token_id": 1,
        "auto_map": {"AutoConfig": "configuration_tiny_llada.TinyLladaConfig",
                     "AutoModel": "modeling_tiny_llada.TinyLladaModelLM"},
    }))
    config = AutoConfig.from_pretrained(d, trust_remote_code=True)
    torch.manual_seed(0)
    AutoModel.from_config(config, trust_remote_code=True).save_pretrained(d)
    tok = build_tokenizer()
    tok.save_pretrained(d)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_diffusion_model(d)  # custom code is refused unless asked for
    model, _ = load_diffusion_model(d, trust_remote_code=True)
    assert type(model.net).__name__ == "TinyLladaModelLM"
    assert model.mask_id == 2 and model.eos_id == 1
    logits = model(torch.tensor([[5, 6, 7]]))
    assert logits.shape == (1, 3, 58)
