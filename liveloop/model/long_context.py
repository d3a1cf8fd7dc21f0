"""Long-context builds: a checkpoint directory (liveloop-tiny as built, or an imported SmolLM2) copied with
its RoPE extended by YaRN to a longer context, the weights untouched.

Agent CLIs (Codex CLI, Claude Code) open with 40-90 KB of instructions and tool schemas, 22k-54k tokens
of the tiny tokenizer: past liveloop-tiny's 512 positions and SmolLM2's 8,192. `extend_context` writes
`config.json`'s `rope_parameters` as YaRN (`factor` = new length / trained length,
`original_max_position_embeddings` = the trained length, the attention factor YaRN's default, so
transformers (learner, hf engine) and vLLM compute the same rotation) and `max_position_embeddings` =
the new length, and adds a `context_extension` entry to the build record. YaRN leaves the fastest
rotating dimensions as trained and interpolates the slow ones; it changes short-context outputs a
little too (measured in docs/operations.md, "Long contexts: the agents preset"). Sliding-window attention would not: vLLM's
qwen3_moe takes no `sliding_window`, so it is not offered.

`ensure_extended` makes the `[model]` of a config whose `context_length` is set: its base
(`base_dir`, built or imported first when missing) extended into `out_dir`, reused after.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from liveloop.checkpoint import save_atomically
from liveloop.model.config import ModelBuildConfig

BUILD_RECORD = "liveloop_build.json"
IMPORT_RECORD = "liveloop_import.json"


def trained_length(config: dict) -> int:
    """The positions the weights were trained on: YaRN's original length if already extended."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return int(rope.get("original_max_position_embeddings") or config["max_position_embeddings"])


def yarn_config(config: dict, context_length: int) -> dict:
    """`config` (a config.json as a dict) with its RoPE extended by YaRN to `context_length` positions."""
    trained = trained_length(config)
    if context_length <= trained:
        raise ValueError(f"context_length {context_length} is not past the trained {trained} positions")
    rope = dict(config.get("rope_parameters") or {})
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    rope = {"rope_type": "yarn", "rope_theta": theta, "factor": context_length / trained,
            "original_max_position_embeddings": trained}
    out = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_theta")}
    return out | {"rope_parameters": rope, "max_position_embeddings": context_length}


def extend_context(src: str | Path, out: str | Path, context_length: int) -> Path:
    """Copy checkpoint directory `src` to `out` (replaced atomically) with YaRN RoPE to `context_length`."""
    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    extended = yarn_config(config, context_length)

    def write(tmp: Path) -> None:
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.tmp-*", "*.old-*"))
        (tmp / "config.json").write_text(json.dumps(extended, indent=2) + "\n")
        record_path = tmp / (BUILD_RECORD if (tmp / BUILD_RECORD).exists() or not (tmp / IMPORT_RECORD).exists()
                             else IMPORT_RECORD)
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        record["context_extension"] = {"from": str(src), "method": "yarn", "trained_positions": trained_length(config),
                                       "context_length": context_length, "rope_parameters": extended["rope_parameters"]}
        record_path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")

    save_atomically(out, write)  # a sibling temporary directory renamed into place; removed on any failure
    return out


def is_extended(path: Path, context_length: int) -> bool:
    """Whether `path` holds a complete model extended to `context_length` positions."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (config.get("max_position_embeddings") == context_length
            and any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")))


def ensure_extended(cfg: ModelBuildConfig, out_dir: str | Path | None, build_base: Callable[[ModelBuildConfig, Path], Path]) -> Path:
    """The long-context model `cfg` describes (`context_length` > 0) at `out_dir` (default `cfg.out_dir`):
    its base (`cfg.base_dir`: imported from `cfg.source`, or made by `build_base` (liveloop/model/build.py
    `ensure_model`, which calls this), when missing) extended, once."""
    from liveloop.home import model_path

    out = Path(out_dir if out_dir is not None else model_path(cfg.out_dir))
    if is_extended(out, cfg.context_length):
        return out
    base_cfg = dataclasses.replace(cfg, context_length=0, base_dir="", out_dir=cfg.base_dir)
    base = model_path(cfg.base_dir)
    if cfg.source:
        from liveloop.model.importer import ensure_imported

        base = ensure_imported(cfg.source, base)
    else:
        base = build_base(base_cfg, base)
    return extend_context(base, out, cfg.context_length)
