"""The BGPO job's objective registry (diffusion/objectives.py): one entry per configurable loss, an
unknown name refused at config load, and each objective's backward on a tiny model: BGPO's
per-sample backward gives VRPO-OL's gradient on-policy (both are the group's share of the batch loss)."""

from __future__ import annotations

import types

import pytest
import torch

from liveloop.config import ConfigError
from liveloop.diffusion.config import LOSSES, BGPOConfig, load_bgpo_config
from liveloop.diffusion.elbo import draw_masks
from liveloop.diffusion.objectives import OBJECTIVES, BGPO, VRPOOL, DiffuGRPO, Prepared, make_objective


def test_the_registry_covers_every_configurable_loss():
    assert set(OBJECTIVES) == set(LOSSES)
    for name in LOSSES:
        objective = make_objective(BGPOConfig(loss=name))
        assert objective.name == name
    assert make_objective(BGPOConfig(loss="bgpo")).per_sample_backward
    assert not make_objective(BGPOConfig(loss="vrpo_ol")).per_sample_backward
    assert not make_objective(BGPOConfig(loss="diffu_grpo")).per_sample_backward


def test_an_unknown_loss_fails_at_config_load():
    with pytest.raises(ConfigError, match="loss"):
        load_bgpo_config(text='[bgpo]\nloss = "ppo"\n')
    with pytest.raises(ValueError, match="bgpo.loss"):  # a config built around the loader
        make_objective(types.SimpleNamespace(loss="ppo"))


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _group(tiny_group):
    model, tok, prompt = tiny_group
    return model, prompt, torch.randint(6, len(tok), (3, 10))


def test_bgpo_per_sample_backward_equals_vrpo_ol_on_policy(tiny_group):
    model, prompt, responses = _group(tiny_group)
    cfg = BGPOConfig(n_t=4, clip_eps=0.2, dual_clip=3.0)
    adv = torch.tensor([1.0, -0.5, -0.5])
    grads = {}
    for objective in (BGPO(cfg), VRPOOL(cfg)):
        draw = draw_masks(3, 10, n_t=4, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            old, seeds = objective.old_terms(model, prompt, responses, draw, torch.Generator().manual_seed(1))
        assert old.shape == (3, 4) and seeds == ()
        model.zero_grad()
        # this group is 3 of the batch's 6 responses: half of the batch loss
        objective.backward(model, Prepared(prompt, responses, adv, draw, old), n_resp=6, update=0)
        grads[objective.name] = _grads(model).clone()
    assert grads["bgpo"].abs().sum() > 0
    assert torch.allclose(grads["bgpo"], grads["vrpo_ol"], atol=1e-6, rtol=1e-4)


def test_diffu_grpo_draws_one_prompt_mask_per_update(tiny_group):
    model, prompt, responses = _group(tiny_group)
    objective = DiffuGRPO(BGPOConfig(loss="diffu_grpo", inner_updates=2))
    draw = draw_masks(3, 10, n_t=1, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        old, seeds = objective.old_terms(model, prompt, responses, draw, torch.Generator().manual_seed(1))
    assert old.shape == (2, 3, 10) and len(seeds) == 2
    p = Prepared(prompt, responses, torch.tensor([1.0, -0.5, -0.5]), draw, old, seeds)
    model.zero_grad()
    metrics = objective.backward(model, p, n_resp=3, update=1)
    # on-policy with the same prompt mask: every ratio is 1, nothing clipped
    assert metrics["diffu_grpo/clip_fraction"] == 0.0 and _grads(model).abs().sum() > 0
