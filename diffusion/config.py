"""The BGPO job's configuration (`configs/jobs/bgpo.toml`): `[bgpo]` (the job), `[sampler]` (rollouts),
`[store]` (where prompts, ratings, versions and rollouts live) and `[build]` (the tiny default, built when
`bgpo.model_dir` names its missing directory). Unknown sections or keys fail at load, naming the key.
The sampler's and the build's settings live here, not beside their torch code (sampler.py, sft.py
import them from here), so that loading the job's config imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from liveloop.config import check_literals, load_sections
from liveloop.diffusion.tasks import TASKS
from liveloop.store.config import StoreConfig

# `loss` stays a str checked against these names, not a Literal: the names belong to the BGPO loop's
# choice of losses (a registry, like the learner's methods), and one list of them is enough
LOSSES = ("bgpo", "vrpo_ol", "diffu_grpo")
PromptSource = Literal["tasks", "store", "both"]
PROMPT_SOURCES: tuple[str, ...] = get_args(PromptSource)
Task = Literal[TASKS]  # the task names of diffusion/tasks.py


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class SamplerConfig:
    gen_length: int = _f(32, "Response positions generated (fixed; unused positions end as EOS).")
    block_length: int = _f(8, "Positions per semi-autoregressive block (gen_length must be a multiple).")
    steps: int = _f(32, "Denoising steps in all; a multiple of the number of blocks.")
    temperature: float = _f(1.0, "Gumbel-max sampling temperature; 0 = greedy.")

    def __post_init__(self) -> None:
        if self.gen_length < 1 or self.block_length < 1 or self.steps < 1:
            raise ValueError("gen_length, block_length and steps must be >= 1")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length})")
        blocks = self.gen_length // self.block_length
        if self.steps % blocks:
            raise ValueError(f"steps ({self.steps}) must be a multiple of the number of blocks ({blocks})")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")


@dataclass(frozen=True)
class DiffusionBuildConfig:
    out_dir: str = _f("models/liveloop-diffusion-tiny", "Directory the built model and tokenizer go to.")
    seed: int = _f(0, "Seed of the data, the initial weights, the masks and the batch order.")
    tasks: tuple[str, ...] = _f(("countdown", "sudoku"), "Tasks trained on (interleaved).")
    num_examples: int = _f(20000, "Training problems generated.")
    gen_length: int = _f(32, "Response length trained on (answer + EOS padding); the sampler's gen_length.")
    hidden_size: int = _f(64, "Width of the residual stream.")
    num_layers: int = _f(3, "Transformer layers (all global, bidirectional attention).")
    num_heads: int = _f(4, "Attention heads.")
    intermediate_size: int = _f(128, "MLP hidden size.")
    train_steps: int = _f(1200, "Optimizer steps.")
    batch_size: int = _f(32, "Sequences per optimizer step.")
    learning_rate: float = _f(5e-3, "Peak AdamW learning rate (linear warmup, cosine decay to 10%).")
    eval_problems: int = _f(32, "Held-out problems whose greedy reward is recorded after the build.")

    def __post_init__(self) -> None:
        for name in ("num_examples", "gen_length", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "train_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DiffusionBuildConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError("DiffusionBuildConfig.learning_rate must be > 0")
        for t in self.tasks:
            if t not in TASKS:
                raise ValueError(f"DiffusionBuildConfig.tasks: unknown task {t!r} (known: {', '.join(TASKS)})")

    def sampler(self) -> SamplerConfig:
        """The sampler setting the build evaluates with (one token per step, blocks of 8)."""
        return SamplerConfig(gen_length=self.gen_length, block_length=min(8, self.gen_length),
                             steps=self.gen_length, temperature=0.0)


@dataclass(frozen=True)
class BGPOConfig:
    model_dir: str = _f("models/liveloop-diffusion-tiny", "Starting policy: a masked diffusion LM directory.")
    trust_remote_code: bool = _f(False, "Load custom model code (LLaDA / Dream checkpoints).")
    out_dir: str = _f("data/bgpo", "Checkpoints (one directory per published version) and trainer state.")
    run_name: str = _f("bgpo", "Learner cursor name and prefix of the stored rollouts' ids.")
    loss: str = _f("bgpo", "bgpo | vrpo_ol | diffu_grpo (the baselines share the loop).")
    prompt_source: PromptSource = _f("both", "tasks | store | both: store prompts first, then task problems.")
    tasks: tuple[Task, ...] = _f(("countdown", "sudoku"), "Task problems to draw prompts from.")
    store_model: str = _f("liveloop-diffusion-tiny", "Stored responses whose `model` is this are prompts.")
    parent_version: int = _f(-1, "Version the starting policy is in the store; -1: the latest (0 if none).")
    steps: int = _f(20, "Policy steps (each: rollouts, n_t masks, inner updates).")
    prompts_per_step: int = _f(4, "Groups per step.")
    group_size: int = _f(8, "G: responses per prompt.")
    n_t: int = _f(16, "Monte-Carlo ELBO samples per response.")
    inner_updates: int = _f(1, "Optimizer steps on each step's rollouts (the old policy is the rollout one).")
    learning_rate: float = _f(5e-4, "AdamW learning rate.")
    max_grad_norm: float = _f(1.0, "Gradient clipping.")
    clip_eps: float = _f(0.2, "PPO clip on the bound's ratio factor; 0 = off.")
    dual_clip: float = _f(3.0, "Dual-clip c for negative advantages; 0 = off.")
    prompt_mask_prob: float = _f(0.15, "diffu_grpo only: prompt tokens masked in its one-pass estimate.")
    publish_every: int = _f(5, "Save a checkpoint and publish a version every N steps (and at the end).")
    store_rollouts: bool = _f(True, "Write every rollout to the store as a response.")
    api_key_id: str = _f("bgpo", "api_key_id of the stored rollouts.")
    seed: int = _f(0, "Seed of task prompts, rollouts and masks (per step: resumes reproduce).")

    def __post_init__(self) -> None:
        check_literals(self)
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        for name in ("steps", "prompts_per_step", "n_t", "inner_updates", "publish_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (advantages are relative to the group)")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("learning_rate and max_grad_norm must be > 0")
        if self.clip_eps < 0 or self.dual_clip < 0 or (0 < self.dual_clip <= 1):
            raise ValueError("clip_eps must be >= 0 and dual_clip 0 (off) or > 1")


@dataclass(frozen=True)
class BGPOJobConfig:
    bgpo: BGPOConfig
    sampler: SamplerConfig
    store: StoreConfig
    build: DiffusionBuildConfig
    path: str = "<defaults>"


_SECTIONS = {"bgpo": BGPOConfig, "sampler": SamplerConfig, "store": StoreConfig, "build": DiffusionBuildConfig}


def load_bgpo_config(path: str | Path | None = None, text: str | None = None) -> BGPOJobConfig:
    return BGPOJobConfig(**load_sections(_SECTIONS, path, text), path=str(path) if path else "<text>")
