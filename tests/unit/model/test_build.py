"""Building the default model at a tiny size: a loadable directory, a falling loss, reproducible weights."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from liveloop.checkpoint import checkpoint_digest
from liveloop.model.build import build_model, ensure_model, masked_next_token_loss
from liveloop.model.config import ModelBuildConfig

torch.set_num_threads(1)
TINY = ModelBuildConfig(corpus_size=200, vocab_size=300, num_layers=2, train_steps=30, batch_size=8)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_model(TINY, tmp_path_factory.mktemp("m") / "tiny", progress=False)


def test_directory_loads_with_auto_classes(built):
    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert 50_000 < model.num_parameters() < 2_000_000
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Tell me about cats."}],
                                           add_generation_prompt=True, return_dict=True, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_build_record(built):
    record = json.loads((built / "liveloop_build.json").read_text())
    assert record["config"]["train_steps"] == 30
    assert record["final_loss"] < record["first_loss"] - 0.5
    assert record["num_parameters"] == AutoModelForCausalLM.from_pretrained(built).num_parameters()
    assert len(record["samples"]) == 6
    assert not list(built.parent.glob("tiny.*")), "temporary directories left behind"
    # where it came from: which weights (the digest a second machine compares) and what decided them
    assert record["model_digest"] == checkpoint_digest(built)  # every file of it, config and tokenizer included
    assert record["model_digest"].startswith("sha256-all:")
    env = record["environment"]
    assert env["torch_threads"] == 1 and env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["packages"]["torch"] == torch.__version__ and "transformers" in env["packages"]


def test_same_seed_same_weights_and_rebuild_replaces(built, tmp_path):
    again = build_model(TINY, tmp_path / "again", progress=False)
    a, b = load_file(built / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = build_model(dataclasses.replace(TINY, seed=1), tmp_path / "seed1", progress=False)
    assert _digest(other) != _digest(again) == _digest(built)  # another [model] seed is another build
    (again / "stale.txt").write_text("x")
    build_model(TINY, again, progress=False)
    assert not (again / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "seed1"]  # no replaced build or temporary left beside


def _digest(model_dir):
    return json.loads((model_dir / "liveloop_build.json").read_text())["model_digest"]


def test_ensure_model_reuses_a_complete_directory(built):
    before = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_model(TINY, built) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == before


def test_masked_next_token_loss():
    # vocab 2, uniform logits: every target costs ln 2
    logits = torch.zeros(1, 3, 2)
    ids = torch.tensor([[0, 1, 1]])
    # targets are tokens 1 and 2; only token 2 is masked in -> mean over one target = ln 2
    assert masked_next_token_loss(logits, ids, torch.tensor([[0.0, 0.0, 1.0]])).item() == pytest.approx(0.6931, 1e-3)
    # a confident right prediction at position 1 (logit 10 for token 1): -log softmax = log(1 + e^-10)
    logits[0, 1, 1] = 10.0
    assert masked_next_token_loss(logits, ids, torch.tensor([[0.0, 0.0, 1.0]])).item() == pytest.approx(4.54e-5, 1e-2)


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelBuildConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="plain_text_fraction"):
        ModelBuildConfig(plain_text_fraction=1.5)
