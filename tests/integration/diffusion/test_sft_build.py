"""The tiny diffusion default's build: seeded, idempotent, atomic, loads back, and SFT lowers the loss."""

from __future__ import annotations

import json

import torch

from liveloop.checkpoint import checkpoint_digest
from liveloop.diffusion.model import load_diffusion_model
from liveloop.diffusion.sft import BUILD_RECORD, DiffusionBuildConfig, build_diffusion_model, ensure_diffusion_model

TINY = DiffusionBuildConfig(num_examples=200, train_steps=40, batch_size=8, hidden_size=32, num_layers=2,
                            num_heads=2, intermediate_size=64, eval_problems=2, learning_rate=5e-3)


def test_build_is_seeded_idempotent_and_learns(tmp_path):
    a = ensure_diffusion_model(TINY, tmp_path / "a", progress=False)
    record = json.loads((a / BUILD_RECORD).read_text())
    assert record["final_loss"] < record["first_loss"]  # 40 SFT steps already lower the masked-token loss
    assert record["sampler"]["gen_length"] == TINY.gen_length and 0.0 <= record["held_out_reward"] <= 1.0
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert ensure_diffusion_model(TINY, tmp_path / "a", progress=False) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp  # complete build: reused, not rebuilt
    b = build_diffusion_model(TINY, tmp_path / "b", progress=False)
    assert checkpoint_digest(a) == checkpoint_digest(b)  # same config and seed: same weights
    model, tok = load_diffusion_model(a)
    assert model.mask_id == tok.mask_token_id
    assert not list(tmp_path.glob(".*tmp*"))  # atomic: no temporary directory left behind
    with torch.no_grad():
        assert model(torch.tensor([[5, 6, 7]])).shape == (1, 3, len(tok))
