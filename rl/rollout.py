"""Sampling replies from a policy in-process (transformers), for critic pre-training, experiments and
benchmarks: token ids with their behavior logprobs, exactly like the engines record them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str


@torch.no_grad()
def sample_reply(model, tokenizer, prompt_ids: list[int], max_tokens: int, generator: torch.Generator, temperature: float = 1.0) -> Rollout:
    model.eval()
    ids: list[int] = []
    lps: list[float] = []
    x, past = torch.tensor([prompt_ids]), None
    for _ in range(max_tokens):
        out = model(input_ids=x, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        lp = torch.log_softmax(logits, -1)
        probs = torch.softmax(logits / temperature, -1) if temperature > 0 else None
        t = int(torch.multinomial(probs, 1, generator=generator)) if probs is not None else int(torch.argmax(logits))
        ids.append(t)
        lps.append(float(lp[t]))
        if t == tokenizer.eos_token_id:
            break
        x = torch.tensor([[t]])
    return Rollout(list(prompt_ids), ids, lps, tokenizer.decode(ids, skip_special_tokens=True))


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]
