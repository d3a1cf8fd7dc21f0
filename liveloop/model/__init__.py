"""Builds liveloop's embedded default model locally.

A tiny Qwen3-MoE chat model trained in a few CPU minutes on a synthetic corpus whose replies mix three
writing styles (cute, chuunibyou, classical) on every topic, so online feedback has something to shape.
Opt-in (`ModelBuildConfig.tool_fraction`), part of the corpus is tool-use dialogues (`tool_corpus`),
often wrong on purpose, so that tool use is also something to learn.
No weights are downloaded: `build.ensure_model` builds the directory once and reuses it.
Importing this package stays light (no torch): import `build` and `tokenizer` where they are used.
"""

from liveloop.model.config import ModelBuildConfig
from liveloop.model.corpus import STYLE_MARKERS, STYLES, TOPICS, Example, generate_corpus

__all__ = [
    "STYLES",
    "STYLE_MARKERS",
    "TOPICS",
    "Example",
    "ModelBuildConfig",
    "generate_corpus",
]
