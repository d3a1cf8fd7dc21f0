from pathlib import Path

import pytest

from liveloop.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_loads_every_section():
    cfg = load_config(ROOT / "configs/default.toml")
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8000
    assert cfg.engine.backend == "vllm"
    assert cfg.store.url.startswith("sqlite:///")
    assert cfg.auth.dev_admin_keys == ("sk-dev-admin",)
    assert cfg.model.out_dir == cfg.engine.model


def test_missing_sections_take_defaults():
    cfg = load_config(text="[server]\nport = 9000\n")
    assert cfg.server.port == 9000 and cfg.engine.max_model_len == 512


@pytest.mark.parametrize(
    "text, message",
    [
        ("[server]\nprot = 1\n", "server.prot: unknown key"),
        ("[store]\nbatch_max = 'x'\n", "store.batch_max: expected int, got str"),
        ("[server]\nport = true\n", "server.port: expected int, got bool"),
        ("[engine]\nmax_model_len = 1.5\n", "engine.max_model_len: expected int"),
        ("[auth]\ndev_user_keys = 'k'\n", "auth.dev_user_keys: expected a list"),
        ("[auth]\ndev_user_keys = [1]\n", "auth.dev_user_keys[0]: expected str"),
        ("[bogus]\nx = 1\n", "bogus: unknown section"),
        ("[engine]\nbackend = 'tgi'\n", "engine: backend must be"),
        ("[server]\nport = 70000\n", "server: port must be"),
        ("[server\n", "invalid TOML"),
    ],
)
def test_bad_config_names_the_key(text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(text=text)


def test_float_field_accepts_int():
    cfg = load_config(text="[engine]\ngpu_memory_utilization = 1\n")
    assert cfg.engine.gpu_memory_utilization == 1.0 and isinstance(cfg.engine.gpu_memory_utilization, float)


# deployment configs; job configs (bgpo.toml, drift.toml, ...) are loaded by their own jobs' tests
SERVER_CONFIGS = ("default.toml", "production.toml")


@pytest.mark.parametrize("path", [ROOT / "configs" / name for name in SERVER_CONFIGS], ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.server.host == "127.0.0.1"  # nothing listens beyond loopback by default
