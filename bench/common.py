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

    cfg = load_config(ROOT / "configs/serve/tiny.toml")
    return ensure_model(cfg.model, default_model_dir())


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


def save(name: str, result: dict, model_dir: Path | None = None, path: Path | None = None) -> Path:
    """Write a result as JSON (bench/results/NAME.json unless `path`) with where it came from: package
    versions, CPU flags and kernel path, threads, and the model's digest (`liveloop.provenance`)."""
    from liveloop.provenance import environment

    path = path or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model_dir if model_dir is not None else default_model_dir()
    env = environment(model if (model / "config.json").is_file() else None)
    path.write_text(json.dumps(result | {"environment": env | result.get("environment", {})}, indent=2) + "\n")
    return path


def default_model_dir() -> Path:
    """Where the tiny model the benches run on lives (built or not): the `tiny` preset's."""
    from liveloop.config import load_config

    return ROOT / load_config(ROOT / "configs/serve/tiny.toml").model.out_dir


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


def logged_rows(paths: list[str], keys: tuple[str, ...]) -> list[dict]:
    """The JSON rows a benchmark printed one per line (each starting with `{"<keys[0]>"`) in these logs,
    one per value of `keys`: a later row replaces an earlier one (a rerun of the same run)."""
    import json

    rows = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f'{{"{keys[0]}"'):
                row = json.loads(line)
                rows[tuple(row[k] for k in keys)] = row
    return list(rows.values())
