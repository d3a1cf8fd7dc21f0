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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.rl.batch import Sample
    from liveloop.rl.rollout import chat_prompt_ids, sample_reply

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    out = []
    for i in range(n):
        r = sample_reply(model, tok, chat_prompt_ids(tok, chat_messages(i)[0]["content"]), max_tokens, torch.Generator().manual_seed(seed + i))
        out.append(Sample.from_rollout(r, float(target in r.text.lower())))
    return out
