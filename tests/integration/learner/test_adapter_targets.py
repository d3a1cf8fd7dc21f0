"""The learner's adapters beyond the attention projections (learner/adapters.py): on the MoE model's
fused experts through peft's `target_parameters` (ParamWrappers) and on lm_head. A step for one
segment's adapter moves only that adapter (the base and another segment's adapter stay bit-identical,
also when a segment is named like a module); a saved adapter holds its LoRA matrices only and loads
back to identical logits, fresh or beside another adapter; a fresh adapter is the base exactly; targets
the engines cannot serve are refused at start."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from liveloop.learner.adapters import AdapterPolicy, UnadaptableTargets
from liveloop.learner.config import LoraSettings

EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
SETTINGS = {
    "experts": LoraSettings(rank=4, alpha=8, target_modules=("q_proj",), target_parameters=EXPERTS),
    "lm_head": LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "lm_head")),
}


def _logits(policy: AdapterPolicy, name: str | None) -> torch.Tensor:
    with torch.no_grad(), (policy.base() if name is None else policy.active(name)) as model:
        return model(input_ids=IDS).logits


def _train(policy: AdapterPolicy, name: str, steps: int = 3) -> None:
    optimizer = torch.optim.Adam(policy.parameters(name), lr=1e-2)
    for _ in range(steps):
        with policy.active(name) as model:
            logp = torch.log_softmax(model(input_ids=IDS).logits[0, :-1], -1)
            loss = -logp.gather(1, IDS[0, 1:, None]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _base_state(policy: AdapterPolicy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.base_model.state_dict().items() if "lora_" not in k}


@pytest.mark.parametrize("kind", ["experts", "lm_head"])
def test_a_step_moves_only_its_own_adapter(model_dir, kind):
    policy = AdapterPolicy(model_dir, SETTINGS[kind])
    policy.add("cozy")
    policy.add("mlp")  # named like a module: its parameters must not be taken for cozy's, nor cozy's for its
    cozy, other = policy.parameters("cozy"), policy.parameters("mlp")
    assert len(cozy) == len(other) > 0 and not {id(p) for p in cozy} & {id(p) for p in other}
    wrapped = "experts" if kind == "experts" else "lm_head"
    names = {id(p): n for n, p in policy.model.named_parameters()}
    assert any(wrapped in names[id(p)] for p in cozy), f"cozy's adapter has no {wrapped} matrices"
    plain, base, before = _logits(policy, None), _base_state(policy), [p.clone() for p in other]
    assert torch.equal(_logits(policy, "cozy"), plain), "a fresh adapter (B = 0) is the base exactly"

    _train(policy, "cozy")
    after = _base_state(policy)
    assert after.keys() == base.keys() and all(torch.equal(after[k], base[k]) for k in base), "the base moved"
    assert all(torch.equal(p, q) for p, q in zip(other, before)), "another segment's adapter moved"
    moved = [names[id(p)] for p in cozy if wrapped in names[id(p)] and "lora_B" in names[id(p)] and p.abs().sum() > 0]
    assert moved, f"the step left cozy's {wrapped} matrices at zero"
    assert torch.equal(_logits(policy, None), plain) and torch.equal(_logits(policy, "mlp"), plain)
    assert not torch.allclose(_logits(policy, "cozy"), plain, atol=1e-4)


@pytest.mark.parametrize("kind", ["experts", "lm_head"])
def test_a_saved_adapter_loads_back_to_identical_logits(model_dir, tmp_path, kind):
    policy = AdapterPolicy(model_dir, SETTINGS[kind])
    policy.add("cozy")
    _train(policy, "cozy")
    want = _logits(policy, "cozy")
    policy.save("cozy", tmp_path / "cozy")
    saved = load_file(str(tmp_path / "cozy" / "adapter_model.safetensors"))
    assert saved and all("lora_A" in k or "lora_B" in k for k in saved), "an adapter holds its LoRA matrices only"

    fresh = AdapterPolicy(model_dir, SETTINGS[kind])
    fresh.add("night")  # cozy then loads beside another adapter (peft's load_adapter path)
    fresh.add("cozy", tmp_path / "cozy")
    assert torch.equal(_logits(fresh, "cozy"), want)
    alone = AdapterPolicy(model_dir, SETTINGS[kind])
    alone.add("cozy", tmp_path / "cozy")  # the first adapter (PeftModel.from_pretrained)
    assert torch.equal(_logits(alone, "cozy"), want)
    plain = _logits(alone, None)
    alone.add("cozy")  # the only adapter reset in place: fresh again, the base exactly
    assert torch.equal(_logits(alone, "cozy"), plain)
    _train(alone, "cozy", steps=1)  # and it still trains (reset kept its parameters trainable)
    assert not torch.equal(_logits(alone, "cozy"), plain)


@pytest.mark.parametrize(
    "parameters, message",
    [
        (("mlp.experts.no_such_proj",), "no_such_proj.*not parameters"),
        (("self_attn.q_proj.weight",), "Linear's weight"),
        (("input_layernorm.weight",), "1-D"),
    ],
)
def test_parameters_the_engines_cannot_serve_are_refused_at_start(model_dir, parameters, message):
    with pytest.raises(UnadaptableTargets, match=message):
        AdapterPolicy(model_dir, LoraSettings(rank=4, alpha=8, target_parameters=parameters))


def test_the_settings_name_each_target_once():
    LoraSettings(target_modules=(), target_parameters=EXPERTS)  # the experts alone are a valid adapter
    for bad in (
        {"target_modules": (), "target_parameters": ()},
        {"target_parameters": ("gate_up_proj",)},  # not <module>.<parameter>
        {"target_parameters": (EXPERTS[0], EXPERTS[0])},
        {"target_modules": ("q_proj", "")},
    ):
        with pytest.raises(ValueError):
            LoraSettings(**bad)
