"""The LoRA critic (`[critic] lora_rank` > 0) on a small dense llama: only its MLP adapter and value head
train; its frozen weights are the learner's base's own tensors (one copy of the model); it learns its
returns; it saves as a peft adapter directory and loads back over its base to the same values; and a
learner on adapters holds the model once for policy, KL reference and critic."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.critic.trainer import Critic
from liveloop.critic.value_model import build_value_model, share_frozen
from liveloop.rl.batch import Sample, make_batch


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory) -> Path:
    """A 2-layer llama with random weights (dense: its MLP projections are LoRA targets)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, max_position_embeddings=128, tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("dense") / "llama"
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _batch():
    rng = np.random.default_rng(0)
    samples = [Sample(rng.integers(5, 500, 5), rng.integers(5, 500, 6 + i), np.full(6 + i, -1.0, np.float32),
                      np.ones(6 + i, np.uint8), float(i % 2), 0) for i in range(4)]
    return make_batch(samples)


def _base(dense_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_only_the_adapter_and_head_train_over_the_bases_own_tensors(dense_dir):
    base = _base(dense_dir)
    torch.manual_seed(0)
    critic = Critic(build_value_model(dense_dir, lora_rank=4, base_dir=dense_dir, share=base), CriticConfig(learning_rate=1e-2))
    trainable = [n for n, p in critic.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "score" in n for n in trainable)
    assert any("mlp.up_proj.lora_A" in n for n in trainable) and not any("self_attn" in n for n in trainable)
    ours = {n.removeprefix("base_model.model.").replace(".base_layer.", "."): p for n, p in critic.model.named_parameters()}
    for name, theirs in base.named_parameters():
        if name in ours:  # model.layers.0.mlp.up_proj.weight, model.embed_tokens.weight, ...: the same storage
            assert ours[name].data_ptr() == theirs.data_ptr(), f"{name} is a copy"
    frozen_before = {n: p.detach().clone() for n, p in base.named_parameters()}
    batch = _batch()
    returns = batch.rewards[:, None].expand(-1, batch.width).float() * batch.action_mask
    first = critic.update(batch, returns)
    for _ in range(20):
        last = critic.update(batch, returns)
    assert last["critic/value_loss"] < first["critic/value_loss"]
    assert all(torch.equal(frozen_before[n], p) for n, p in base.named_parameters()), "the shared base moved"


def test_it_saves_as_an_adapter_and_loads_back_to_the_same_values(dense_dir, tmp_path):
    torch.manual_seed(0)
    critic = Critic(build_value_model(dense_dir, lora_rank=4), CriticConfig(learning_rate=1e-2))
    batch = _batch()
    critic.update(batch, batch.rewards[:, None].expand(-1, batch.width).float() * batch.action_mask)
    critic.save(str(tmp_path / "critic"))
    assert (tmp_path / "critic" / "adapter_config.json").is_file()
    assert sum(f.stat().st_size for f in (tmp_path / "critic").iterdir()) < 1_000_000  # the adapter and head, not the model
    again = Critic(build_value_model(tmp_path / "critic", base_dir=dense_dir, share=_base(dense_dir)), CriticConfig())
    assert torch.allclose(critic.values(batch), again.values(batch), atol=1e-6)
    with pytest.raises(ValueError, match="base model directory"):
        build_value_model(tmp_path / "critic")


def test_sharing_skips_what_differs(dense_dir):
    base = _base(dense_dir)
    with torch.no_grad():
        base.model.layers[0].mlp.up_proj.weight.mul_(2)  # a base that is not this critic's
    critic = build_value_model(dense_dir)
    critic.model.layers[1].mlp.down_proj.weight = torch.nn.Parameter(torch.zeros(3, 3))  # another shape
    saved = share_frozen(critic, base)
    assert saved > 0 and critic.model.layers[1].mlp.down_proj.weight.shape == (3, 3)


def test_a_lane_holds_the_model_once(dense_dir, tmp_path):
    """An adapter learner (a lane over the shared base) with a LoRA critic: the critic's frozen weights and
    the policy's are one set of tensors."""
    from liveloop.learner.config import LearnerConfig, LoraSettings
    from liveloop.learner.lanes import build_learner
    from liveloop.segments import SegmentsConfig
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=f"sqlite:///{tmp_path / 'store.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(dense_dir))
    config = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), kl_coef=0.1,
                           lora=dataclasses.replace(LoraSettings(), rank=4))
    learner = build_learner(
        config, CriticConfig(lora_rank=4), dense_dir, segments=SegmentsConfig(adapters="shared"),
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    (lane,) = learner.lanes.values()
    policy = {p.data_ptr() for p in lane.policy.parameters() if not p.requires_grad}
    # frozen, but for the value head's original (peft keeps it beside the trained copy: the critic's own, 2 small tensors)
    critic = {p.data_ptr() for n, p in lane.critic.model.named_parameters() if not p.requires_grad and "score" not in n}
    embed = lane.policy.get_input_embeddings().weight.data_ptr()
    assert embed in critic and len(critic - policy) == 0, "the critic holds frozen weights of its own"
    store.close()
