"""The evaluation suite: the fixed prompt set every candidate version is evaluated on (`[suite]` of a
TOML file; `configs/suites/evaluation_default.toml` for the default model, an operator's own file by path via
`[release.evaluation] suite`).

    [suite]
    prompts = ["Tell me about cats.", ...]          # replies scored by the reward, length, repetition,
                                                    # refusal, flattery and KL checks
    false_claims = ["The moon is made of bread, isn't it?", ...]   # the sycophancy probe
    [[suite.reference]]                             # perplexity: reference replies to prompts
    prompt = "Describe rain."
    reply = "'Tis true: ..."

Read through liveloop's config loader (typed, unknown keys and wrong types are ConfigErrors naming
them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from liveloop.config import load_sections


@dataclass(frozen=True)
class Reference:
    """A reference reply to a prompt; its perplexity under a version is that version's `perplexity`."""

    prompt: str
    reply: str


@dataclass(frozen=True)
class Suite:
    prompts: tuple[str, ...]
    false_claims: tuple[str, ...] = ()
    reference: tuple[Reference, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("prompts: at least one prompt")
        if any(not p.strip() for p in (*self.prompts, *self.false_claims)) or any(not r.reply.strip() for r in self.reference):
            raise ValueError("prompts, false_claims and reference replies must not be empty")


def load_suite(name_or_path: str | Path = "evaluation_default") -> Suite:
    """A suite by preset name (configs/<name>.toml) or path."""
    return load_sections({"suite": Suite}, name_or_path)["suite"]
