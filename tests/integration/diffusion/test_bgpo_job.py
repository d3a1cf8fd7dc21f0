"""The BGPO job on a tiny diffusion model with a real SQLite store: publishes versions with lineage and
metrics, stores its rollouts, learns from stored ratings, and a killed run resumes to the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from liveloop.checkpoint import checkpoint_digest, legacy_digest
from liveloop.config import ConfigError, resolve_config
from liveloop.diffusion.bgpo import latest_checkpoint, run_bgpo
from liveloop.diffusion.config import load_bgpo_config
from liveloop.diffusion.model import TinyModelConfig, tiny_model
from liveloop.diffusion.tokenizer import build_tokenizer
from liveloop.store.config import StoreConfig
from liveloop.store.records import FeedbackRecord, ResponseRecord
from liveloop.store.store import Store

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    tok = build_tokenizer()
    d = tmp_path_factory.mktemp("diffusion") / "model"
    tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0).save(d, tok)
    return d


def _job(tmp: Path, model_dir: Path, **bgpo):
    settings = {"model_dir": str(model_dir), "out_dir": str(tmp / "out"), "steps": 4, "prompts_per_step": 2,
                "group_size": 3, "n_t": 2, "publish_every": 2, "learning_rate": 0.01, **bgpo}
    lines = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in settings.items())
    return load_bgpo_config(text=f"""
[bgpo]
{lines}
[sampler]
gen_length = 16
block_length = 8
steps = 8
[store]
url = "sqlite:///{tmp / 'store.db'}"
""")


def _seed_ratings(url: str) -> None:
    """Two rated responses of the diffusion model to a free-form prompt: rewards 1 and 0."""
    tok = build_tokenizer()
    store = Store(StoreConfig(url=url))
    store.migrate()
    store.versions.ensure_base_version("diffusion-base")  # the version that served the rated responses
    prompt = tuple(tok.encode("say hi\n", add_special_tokens=False))
    for i, (text, reward) in enumerate([("hi", 1), ("no", 0)]):
        ids = tuple(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
        store.feedback.insert_responses([ResponseRecord(
            id=f"user-{i}", api_key_id="k", model="liveloop-diffusion-tiny", policy_version=0, endpoint="chat",
            prompt_ids=prompt, response_ids=ids, behavior_logprobs=(0.0,) * len(ids), finish_reason="stop",
            temperature=1.0, top_p=1.0, latency_ms=1.0)])
        store.feedback.put_feedback(FeedbackRecord(response_id=f"user-{i}", api_key_id="k", reward=reward))
    store.close()


def test_job_publishes_versions_stores_rollouts_and_resumes_identically(tmp_path, model_dir):
    # run A: 4 steps straight through
    a = tmp_path / "a"
    job_a = _job(a, model_dir)
    _seed_ratings(job_a.store.url)
    out = run_bgpo(job_a, progress=False)
    assert out["step"] == 4 and out["version"] == 2
    store = Store(job_a.store)
    v1, v2 = store.versions.get_version(1), store.versions.get_version(2)
    assert v1.parent == 0 and v2.parent == 1  # lineage: base model 0 -> 1 -> 2
    assert v1.learner_step == 2 and v2.learner_step == 4 and v1.samples_used > 0
    assert v1.metrics["bgpo/loss_kind"] == "bgpo" and "bgpo/reward_since_parent" in v1.metrics
    assert v1.checkpoint_sha256 == checkpoint_digest(v1.checkpoint_path)
    assert store.feedback.get_cursor("bgpo") == 2  # both ratings consumed
    # the stored ratings (1 vs 0) gave step 0 a learning signal: the weights moved from the base model
    assert checkpoint_digest(v1.checkpoint_path) != checkpoint_digest(model_dir)
    # rollouts: 4 steps x (1 store group topped up? no: free-form prompt -> stored only) + task groups
    first = store.feedback.get_response("bgpo-s000000-g1-r0")
    assert first is not None and first.policy_version == 0 and first.request_meta["source"] == "bgpo"
    assert len(first.response_ids) == len(first.behavior_logprobs) <= 16
    late = store.feedback.get_response("bgpo-s000002-g1-r0")
    assert late is not None and late.policy_version == 1  # produced by the version published at step 2
    n_responses = store.feedback.counts()["responses"]
    store.close()

    # run B: "killed" after 1 step (no checkpoint yet), then after 3 (one checkpoint), then to the end
    b = tmp_path / "b"
    job_b = _job(b, model_dir)
    _seed_ratings(job_b.store.url)
    assert run_bgpo(job_b, progress=False, max_steps=1)["step"] == 1
    assert latest_checkpoint(b / "out") is None
    assert run_bgpo(job_b, progress=False, max_steps=3)["step"] == 3
    assert latest_checkpoint(b / "out").name == "v00001"
    out_b = run_bgpo(job_b, progress=False)
    assert out_b["step"] == 4 and out_b["version"] == 2
    store_b = Store(job_b.store)
    assert store_b.feedback.counts()["responses"] == n_responses  # redone steps did not duplicate rollouts
    assert store_b.feedback.counts()["policy_versions"] == 3
    # the same weights (the row's digest also covers trainer_state.pt, whose config names each job's paths)
    assert legacy_digest(store_b.versions.get_version(2).checkpoint_path) == legacy_digest(
        Store(job_a.store).versions.get_version(2).checkpoint_path)
    store_b.close()
    # finished: running again does nothing
    assert run_bgpo(job_b, progress=False)["version"] == 2


@pytest.mark.parametrize("loss", ["vrpo_ol", "diffu_grpo"])
def test_baseline_losses_run_through_the_same_loop(tmp_path, model_dir, loss):
    job = _job(tmp_path, model_dir, loss=loss, steps=1, publish_every=1)
    _seed_ratings(job.store.url)
    out = run_bgpo(job, progress=False)
    assert out["version"] == 1 and out["bgpo/grad_norm"] > 0
    store = Store(job.store)
    assert store.versions.get_version(1).metrics["bgpo/loss_kind"] == loss
    store.close()


def test_config_file_loads_and_unknown_keys_fail():
    job = load_bgpo_config("bgpo")
    assert job.bgpo.loss == "bgpo" and job.bgpo.n_t == 16
    with pytest.raises(ConfigError, match="bgpo.n_tt: unknown key"):
        load_bgpo_config(text="[bgpo]\nn_tt = 3\n")
    with pytest.raises(ConfigError, match="nonsense: unknown section"):
        load_bgpo_config(text="[nonsense]\n")
    with pytest.raises(ConfigError, match="loss must be one of"):
        load_bgpo_config(text='[bgpo]\nloss = "ppo"\n')


def test_cli_group_parses_and_trains(tmp_path, model_dir, capsys):
    import argparse

    from liveloop.diffusion import cli

    job_text = resolve_config("bgpo").read_text()
    cfg = tmp_path / "bgpo.toml"
    cfg.write_text(job_text.replace('model_dir = "models/liveloop-diffusion-tiny"', f'model_dir = "{model_dir}"')
                   .replace('out_dir = "data/bgpo"', f'out_dir = "{tmp_path / "out"}"')
                   .replace("steps = 40", "steps = 1").replace("group_size = 8", "group_size = 2")
                   .replace("n_t = 16", "n_t = 1").replace("prompts_per_step = 4", "prompts_per_step = 1")
                   .replace("gen_length = 32", "gen_length = 8").replace("steps = 32", "steps = 8")
                   .replace('url = "sqlite:///data/liveloop.db"', f'url = "sqlite:///{tmp_path / "s.db"}"'))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bgpo", "train", "--config", str(cfg), "--no-progress"])
    assert cli.run(args) == 0
    assert '"version": 1' in capsys.readouterr().out
