"""The long-context build step (liveloop/model/long_context.py): the config keys it writes, the copy it
makes, and the agents preset that uses it."""

from __future__ import annotations

import json

import pytest

from liveloop.model.config import ModelBuildConfig
from liveloop.model.build import ensure_model
from liveloop.model.long_context import ensure_extended, extend_context, is_extended, trained_length, yarn_config

TINY_CONFIG = {"model_type": "qwen3_moe", "max_position_embeddings": 512, "head_dim": 32, "hidden_size": 64,
               "num_attention_heads": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def _checkpoint(path, config=TINY_CONFIG):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "tokenizer.json").write_text("{}")
    (path / "liveloop_build.json").write_text(json.dumps({"model_digest": "sha256-all:x"}))
    return path


def test_yarn_config_keys():
    out = yarn_config(TINY_CONFIG, 65536)
    assert out["max_position_embeddings"] == 65536
    assert out["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                                      "original_max_position_embeddings": 512}
    assert {k: v for k, v in out.items() if k not in ("rope_parameters", "max_position_embeddings")} == \
        {k: v for k, v in TINY_CONFIG.items() if k not in ("rope_parameters", "max_position_embeddings")}
    # extending an extension starts from the trained length, not the extended one
    assert trained_length(out) == 512
    assert yarn_config(out, 32768)["rope_parameters"]["factor"] == 64.0
    # an old-style config (rope_theta at the top, rope_scaling) comes out in rope_parameters alone
    old = {"max_position_embeddings": 8192, "rope_theta": 100000.0, "rope_scaling": None}
    new = yarn_config(old, 32768)
    assert "rope_scaling" not in new and "rope_theta" not in new
    assert new["rope_parameters"]["rope_theta"] == 100000.0 and new["rope_parameters"]["factor"] == 4.0
    with pytest.raises(ValueError):
        yarn_config(TINY_CONFIG, 512)


def test_transformers_reads_the_extension():
    from transformers import Qwen3MoeConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Qwen3MoeConfig(**yarn_config({**TINY_CONFIG, "vocab_size": 1024}, 65536))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    assert inv_freq.shape == (16,) and attention_factor > 1.0  # YaRN's default attention temperature


def test_extend_copies_and_records(tmp_path):
    src = _checkpoint(tmp_path / "tiny")
    out = extend_context(src, tmp_path / "agents", 65536)
    assert is_extended(out, 65536) and not is_extended(src, 65536)
    assert (out / "model.safetensors").read_bytes() == b"weights"  # the weights untouched
    assert json.loads((src / "config.json").read_text()) == TINY_CONFIG  # the source untouched
    record = json.loads((out / "liveloop_build.json").read_text())
    assert record["model_digest"] == "sha256-all:x"
    assert record["context_extension"]["trained_positions"] == 512
    assert record["context_extension"]["context_length"] == 65536
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agents", "tiny"]  # no temporary directory left


def test_ensure_extended_reuses_and_validates(tmp_path):
    src = _checkpoint(tmp_path / "tiny")
    cfg = ModelBuildConfig(out_dir=str(tmp_path / "agents"), base_dir=str(src), context_length=65536)
    out = ensure_extended(cfg, None, ensure_model)
    mtime = (out / "config.json").stat().st_mtime_ns
    assert ensure_extended(cfg, None, ensure_model) == out and (out / "config.json").stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="base_dir"):
        ModelBuildConfig(context_length=65536)
    with pytest.raises(ValueError):
        ModelBuildConfig(context_length=-1, base_dir="x")


def test_agents_preset():
    from liveloop.config import load_config

    cfg = load_config("agents")
    assert cfg.engine.backend == "vllm" and cfg.engine.prefix_caching
    assert cfg.engine.max_model_len == cfg.model.context_length == 131072
    assert cfg.engine.model == cfg.model.out_dir and cfg.model.base_dir == load_config("tiny").model.out_dir
    assert not load_config("default").engine.prefix_caching and not load_config("tiny").engine.prefix_caching
