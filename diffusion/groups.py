"""Builds one BGPO step's groups: prompts (rated responses from the store, then task problems), G
responses per prompt, and a reward per response. Owns the reward rule: a stored user rating where the
response was rated, else the task reward; a fresh rollout of a prompt that is not a task prompt has no
reward, so such a group holds only its stored, rated responses.

A stored diffusion response is kept EOS-truncated (as served); it is padded back to `gen_length` with EOS,
the fixed length the sampler produced and the ELBO scores.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from liveloop.diffusion import tasks
from liveloop.diffusion.model import MaskedDiffusionLM
from liveloop.diffusion.sampler import SamplerConfig, generate, pad_to_length, truncate_at_eos
from liveloop.store.records import StoredFeedback, StoredResponse


@dataclass
class Group:
    prompt_ids: list[int]
    prompt: str
    task: str | None
    responses: list[list[int]] = field(default_factory=list)  # each exactly gen_length ids
    rewards: list[float] = field(default_factory=list)
    stored_ids: list[str | None] = field(default_factory=list)  # response id in the store; None: new rollout
    commit_logprobs: list[list[float]] = field(default_factory=list)  # rollouts only (stored: empty)


def store_groups(rated: list[tuple[StoredFeedback, StoredResponse]], store_model: str, gen_length: int,
                 eos_id: int, decode) -> tuple[list[Group], int]:
    """Rated responses of `store_model` grouped by prompt (latest rating per response wins); returns the
    groups and how many rated responses were skipped (another model, or longer than gen_length)."""
    by_prompt: dict[tuple[int, ...], Group] = {}
    latest: dict[str, tuple[StoredResponse, int]] = {}
    skipped = 0
    for fb, resp in rated:
        if resp.model != store_model or len(resp.response_ids) > gen_length:
            skipped += 1
            continue
        latest[resp.id] = (resp, fb.reward)
    for resp, rating in latest.values():
        key = tuple(int(t) for t in resp.prompt_ids)
        if key not in by_prompt:
            text = decode(list(key))
            by_prompt[key] = Group(list(key), text, tasks.task_of(text))
        g = by_prompt[key]
        g.responses.append(pad_to_length([int(t) for t in resp.response_ids], gen_length, eos_id))
        g.rewards.append(float(rating))
        g.stored_ids.append(resp.id)
        g.commit_logprobs.append([])
    return list(by_prompt.values()), skipped


def task_groups(task_names: tuple[str, ...], n: int, seed: int, encode) -> list[Group]:
    rng = random.Random(seed)
    problems = [tasks.make_problem(task_names[i % len(task_names)], rng) for i in range(n)]
    return [Group(encode(p.prompt), p.prompt, p.task) for p in problems]


@torch.no_grad()
def fill_with_rollouts(model: MaskedDiffusionLM, groups: list[Group], group_size: int, sampler: SamplerConfig,
                       generator: torch.Generator, decode) -> None:
    """Top every task group up to `group_size` responses sampled from `model`, rewarded by the task."""
    was_training = model.training
    model.eval()
    for g in groups:
        need = group_size - len(g.responses)
        if need <= 0 or g.task is None:
            continue
        out = generate(model, torch.tensor([g.prompt_ids] * need), sampler, generator)
        for ids, lps in zip(out.response_ids.tolist(), out.commit_logprobs.tolist()):
            g.responses.append(ids)
            g.rewards.append(float(tasks.reward(g.prompt, decode(ids))))
            g.stored_ids.append(None)
            g.commit_logprobs.append(lps)
    model.train(was_training)


def served_form(ids: list[int], logprobs: list[float], eos_id: int) -> tuple[list[int], list[float], str]:
    """A rollout as the diffusion engine serves it: up to and including the first EOS."""
    kept = truncate_at_eos(ids, eos_id)
    return kept, logprobs[: len(kept)], "stop" if kept and kept[-1] == eos_id else "length"
