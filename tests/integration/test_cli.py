"""The `liveloop` command line as an operator runs it (real processes, real databases)."""

import json
import subprocess
import sys
from pathlib import Path

from liveloop.store.migrate import head_revision

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "liveloop.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_store_migrate_and_stats(store_url):
    out = run("store", "migrate", "--url", store_url)
    assert out.returncode == 0, out.stderr
    assert f"schema at {head_revision()}" in out.stdout
    stats = run("store", "stats", "--url", store_url)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout) == {"responses": 0, "feedback": 0, "policy_versions": 0}


def test_stats_refuses_unmigrated_database(tmp_path):
    out = run("store", "stats", "--url", f"sqlite:///{tmp_path / 'empty.db'}")
    assert out.returncode == 2 and "run `liveloop store migrate`" in out.stderr


def test_bad_config_fails_naming_the_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[store]\nurll = 'x'\n")
    out = run("--config", str(cfg), "store", "migrate")
    assert out.returncode == 2 and "store.urll: unknown key" in out.stderr


def test_missing_model_dir_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[engine]\nmodel = '{tmp_path / 'nothing'}'\n[auth]\ndev_user_keys = ['k']\n")
    out = run("--config", str(cfg), "serve", "--port", "1")
    assert out.returncode == 2 and "not a Hugging Face checkpoint directory" in out.stderr


def test_critic_pretrain_from_store_needs_ratings(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f"[engine]\nmodel = '{ROOT / 'models/liveloop-tiny'}'\n[store]\nurl = 'sqlite:///{tmp_path / 's.db'}'\n"
        f"[learner]\ncheckpoint_dir = '{tmp_path / 'v'}'\n"
    )
    assert run("--config", str(cfg), "store", "migrate").returncode == 0
    out = run("--config", str(cfg), "critic", "pretrain", "--from-store")
    assert out.returncode == 2 and "at least one rated sample" in out.stderr
    out = run("--config", str(cfg), "critic", "pretrain")
    assert out.returncode == 2 and "critic.pretrain_reward is not set" in out.stderr


def test_config_in_both_positions(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[store]\nbatch_max = 'many'\n")
    for args in (("--config", str(cfg), "store", "stats"), ("store", "stats", "--config", str(cfg))):
        out = run(*args)
        assert out.returncode == 2 and "store.batch_max" in out.stderr, (args, out.stderr)


def test_an_unreachable_server_is_one_line(tmp_path):
    out = run("versions", "--base-url", "http://127.0.0.1:9", "--api-key", "k")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]  # one line, no traceback
    assert "cannot reach the server at http://127.0.0.1:9" in out.stderr and "INFO" not in out.stderr


def test_config_by_preset_name_from_any_directory(tmp_path, store_url):
    assert run("store", "migrate", "--url", store_url, "--config", "default", cwd=tmp_path).returncode == 0
    for args in (("--config", "default", "store", "stats"), ("store", "stats", "--config", "production")):
        out = run(*args, "--url", store_url, cwd=tmp_path)  # configs/ is the repository's, not the working directory's
        assert out.returncode == 0, (args, out.stderr)
    out = run("store", "stats", "--config", "defualt", "--url", store_url, cwd=tmp_path)
    assert out.returncode == 2 and "defualt: no preset of that name" in out.stderr and "default" in out.stderr


def test_serve_takes_config_after_the_subcommand(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"extends = \"default\"\n[engine]\nmodel = '{tmp_path / 'nothing'}'\n")
    out = run("serve", "--config", str(cfg), "--port", "1")
    assert out.returncode == 2 and "not a Hugging Face checkpoint directory" in out.stderr
