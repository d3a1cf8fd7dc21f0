"""Builds liveloop's embedded default model locally.

A tiny Qwen3-MoE chat model trained in a few CPU minutes on a synthetic corpus whose replies mix three
writing styles (cute, chuunibyou, classical) on every topic, so online feedback has something to shape.
No weights are downloaded: `ensure_model` builds the directory once and reuses it.
"""

from liveloop.model.build import build_model, ensure_model
from liveloop.model.config import ModelBuildConfig
from liveloop.model.corpus import STYLE_MARKERS, STYLES, TOPICS, Example, generate_corpus
from liveloop.model.tokenizer import train_tokenizer

__all__ = [
    "STYLES",
    "STYLE_MARKERS",
    "TOPICS",
    "Example",
    "ModelBuildConfig",
    "build_model",
    "ensure_model",
    "generate_corpus",
    "train_tokenizer",
]
