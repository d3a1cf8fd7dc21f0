"""Builds the tiny diffusion default: character tokenizer -> tiny ModernBERT masked LM -> brief masked-
diffusion SFT on the tasks' reference answers -> a Hugging Face directory on disk, so that BGPO starts from
a partly competent policy (it writes the answer format and gets some problems right).

SFT loss (LLaDA's): per example t ~ U(eps, 1); each response position (the answer, then EOS up to
`gen_length`) is masked with probability t; loss = sum over masked positions of CE / t / L. The prompt is
never masked. `ensure_diffusion_model` builds once and reuses the directory (idempotent); the build is
seeded and writes atomically, with `liveloop_diffusion_build.json` recording config, losses and the
held-out reward of greedy samples.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from liveloop.checkpoint import save_atomically
from liveloop.diffusion import tasks
from liveloop.diffusion.config import DiffusionBuildConfig, SamplerConfig  # torch-free settings
from liveloop.diffusion.model import MaskedDiffusionLM, TinyModelConfig, tiny_model
from liveloop.diffusion.sampler import generate
from liveloop.diffusion.tokenizer import build_tokenizer

BUILD_RECORD = "liveloop_diffusion_build.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", BUILD_RECORD)


def ensure_diffusion_model(cfg: DiffusionBuildConfig, out_dir: str | Path | None = None,
                           progress: bool = True) -> Path:
    """Return the model directory, building it first unless it already holds a complete build."""
    out = Path(out_dir if out_dir is not None else cfg.out_dir)
    if all((out / name).is_file() for name in REQUIRED_FILES):
        return out
    return build_diffusion_model(cfg, out, progress)


def build_diffusion_model(cfg: DiffusionBuildConfig, out_dir: str | Path | None = None,
                          progress: bool = True) -> Path:
    start = time.monotonic()
    out = Path(out_dir if out_dir is not None else cfg.out_dir)
    # 1. Tokenizer and data.
    tokenizer = build_tokenizer()
    train = tasks.dataset(cfg.tasks, cfg.num_examples, cfg.seed)
    held_out = tasks.dataset(cfg.tasks, cfg.eval_problems, cfg.seed + 10_000)
    examples = [encode_example(tokenizer, p.prompt, p.answer, cfg.gen_length) for p in train]
    # 2. Model.
    model = tiny_model(TinyModelConfig(cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size,
                                       max_position_embeddings=256), tokenizer, cfg.seed)
    # 3. Training.
    losses = sft_train(model, examples, cfg, progress)
    # 4. Held-out greedy reward, then save.
    reward = evaluate(model, tokenizer, held_out, cfg.sampler(), seed=cfg.seed)
    tail = losses[-max(1, len(losses) // 20):]
    record = {
        "config": dataclasses.asdict(cfg),
        "sampler": dataclasses.asdict(cfg.sampler()),
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),
        "loss_curve": losses[:: max(1, len(losses) // 20)],
        "held_out_reward": reward,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.monotonic() - start, 2),
    }

    def write(tmp: Path) -> None:
        model.save(tmp, tokenizer)
        (tmp / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")

    return save_atomically(out, write)


def encode_example(tokenizer, prompt: str, answer: str, gen_length: int) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids padded with EOS to gen_length); answers longer than that are refused."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    response = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    if len(response) > gen_length:
        raise ValueError(f"answer of {len(response)} tokens does not fit gen_length={gen_length}: {answer!r}")
    return prompt_ids, response + [tokenizer.eos_token_id] * (gen_length - len(response))


def diffusion_sft_loss(model: MaskedDiffusionLM, prompts: list[list[int]], responses: torch.Tensor,
                       generator: torch.Generator, eps: float = 1e-3) -> torch.Tensor:
    """LLaDA's SFT loss for a batch: responses [B, L] (fixed length), prompts of any length (right-padded
    with an attention mask)."""
    bsz, length = responses.shape
    t = eps + (1 - eps) * torch.rand(bsz, 1, generator=generator)
    mask = torch.rand(bsz, length, generator=generator) < t
    width = max(len(p) for p in prompts) + length
    x = torch.full((bsz, width), model.pad_id, dtype=torch.long)
    attn = torch.zeros(bsz, width, dtype=torch.long)
    targets = torch.full((bsz, width), -100, dtype=torch.long)
    weights = torch.zeros(bsz, width)
    for r, p in enumerate(prompts):
        n = len(p)
        x[r, :n] = torch.tensor(p)
        x[r, n : n + length] = torch.where(mask[r], model.mask_id, responses[r])
        attn[r, : n + length] = 1
        targets[r, n : n + length] = torch.where(mask[r], responses[r], -100)
        weights[r, n : n + length] = mask[r].float() / t[r]
    logits = model(x, attention_mask=attn)
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten().clamp(min=0), reduction="none")
    return (ce * weights.flatten()).sum() / (bsz * length)


def _lr_factor(step: int, total: int) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def sft_train(model: MaskedDiffusionLM, examples: list[tuple[list[int], list[int]]], cfg: DiffusionBuildConfig,
              progress: bool) -> list[float]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg.train_steps))
    rng = random.Random(cfg.seed + 1)
    generator = torch.Generator().manual_seed(cfg.seed + 2)
    losses = []
    bar = tqdm(range(cfg.train_steps), desc="building diffusion model", disable=not progress)
    for _ in bar:
        batch = rng.sample(examples, min(cfg.batch_size, len(examples)))
        loss = diffusion_sft_loss(model, [p for p, _ in batch], torch.tensor([r for _, r in batch]), generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return losses


@torch.no_grad()
def evaluate(model: MaskedDiffusionLM, tokenizer, problems: list[tasks.Problem], sampler: SamplerConfig,
             seed: int = 0) -> float:
    """Mean task reward of one sample per problem (greedy when sampler.temperature is 0)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for p in problems:
        prompt = torch.tensor([tokenizer.encode(p.prompt, add_special_tokens=False)])
        out = generate(model, prompt, sampler, generator)
        text = tokenizer.decode(out.response_ids[0].tolist(), skip_special_tokens=False)
        total += tasks.reward(p.prompt, text) or 0.0
    model.train(was_training)
    return total / max(1, len(problems))
