"""Shared pieces of the benchmarks: the default model, chat prompts, summary statistics, results."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

TOPICS = ["cats", "the sea", "rain", "bread", "the moon", "forests", "trains", "music"]


def default_model() -> Path:
    from liveloop.config import load_config
    from liveloop.model.build import ensure_model

    cfg = load_config(ROOT / "configs/default.toml")
    return ensure_model(cfg.model, ROOT / cfg.model.out_dir)


def chat_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def rated_samples(model_dir: Path, n: int, target: str = "behold", max_tokens: int = 48, seed: int = 0):
    """n replies sampled from the model (temperature 1) to the default prompts, rewarded 1 when they
    contain `target`: the same kind of data the online learner sees."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.learner.batch import Sample

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    for i in range(n):
        text = tok.apply_chat_template(chat_messages(i), add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        g = torch.Generator().manual_seed(seed + i)
        ids, lps, x, past = [], [], torch.tensor([prompt]), None
        with torch.no_grad():
            for _ in range(max_tokens):
                o = model(input_ids=x, past_key_values=past, use_cache=True)
                past = o.past_key_values
                lp = torch.log_softmax(o.logits[0, -1].float(), -1)
                t = int(torch.multinomial(lp.exp(), 1, generator=g))
                ids.append(t)
                lps.append(float(lp[t]))
                if t == tok.eos_token_id:
                    break
                x = torch.tensor([[t]])
        reward = float(target in tok.decode(ids, skip_special_tokens=True).lower())
        out.append(Sample(np.array(prompt), np.array(ids), np.array(lps, np.float32), np.ones(len(ids), np.uint8), reward, 0))
    return out
