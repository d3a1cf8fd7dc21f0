"""A simulated tool-use environment: tasks by seed, tool calls run, final answers rated like a user's thumbs.

Owns the environment's side of a tool-use episode: which task a seed draws (the question, the OpenAI
`tools` list it offers, the expected answer), running whatever call a model wrote (a name and its
arguments as a dict or as the JSON text the model wrote) into the tool's result text, and a binary
rating of the final answer. It never raises on model output: an unknown tool, arguments that are not
JSON or do not fit the tool come back as an `error: ...` result the model can read.

The tools, their table and the task questions are `liveloop.model.tool_corpus`'s (one source of truth
with the build's tool dialogues). Knows nothing about tokens, models, chat templates or servers: a
caller parses the calls out of a reply (e.g. the server's hermes parser) and renders the results.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from liveloop.model.tool_corpus import LOOKUP, TABLE, ToolTask, run_call, sample_task, tool_specs


@dataclass(frozen=True)
class EnvTask:
    """One episode's task: ask `question` offering `tools`; the answer a user accepts is `expected`."""

    seed: int
    question: str
    tools: list[dict[str, Any]]  # OpenAI `tools` (type "function")
    expected: str
    kind: str  # the tool that answers it: "calculator" or "lookup"
    task: ToolTask  # with the correct call, for analysis

    @classmethod
    def of(cls, task: ToolTask, seed: int) -> EnvTask:
        return cls(seed, task.question, tool_specs(), task.answer, task.kind, task)

    def messages(self) -> list[dict[str, Any]]:
        """The episode's first turn, as OpenAI chat messages."""
        return [{"role": "user", "content": self.question}]


def sample(seed: int) -> EnvTask:
    """The task of `seed` (the same seed, the same task)."""
    return EnvTask.of(sample_task(random.Random(seed)), seed)


def run_tool(name: Any, arguments: Mapping[str, Any] | str | None) -> str:
    """The result text of calling tool `name` with `arguments` (a dict, or the JSON text of one)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return f"error: arguments are not JSON: {arguments[:80]!r}"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return "error: arguments must be a JSON object"
    if not isinstance(name, str):
        return "error: a tool name must be a string"
    return run_call(name, arguments)


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?![\w]|\.\d)")
_COUNTRY = re.compile(r"\b(" + "|".join(map(re.escape, TABLE.values())) + r")\b", re.IGNORECASE)


def answer_of(task: EnvTask, text: str) -> str | None:
    """The answer `text` gives: its last integer (calculator tasks) or last country of the table
    (lookup tasks), None if it names none. The last one counts, as a reader takes "7 + 5 is 12"."""
    pattern = _COUNTRY if task.kind == LOOKUP else _NUMBER
    found = pattern.findall(text or "")
    if not found:
        return None
    last = found[-1]
    return next((c for c in TABLE.values() if c.lower() == last.lower()), last) if task.kind == LOOKUP else last


def rate(task: EnvTask, text: str | None) -> int:
    """1 if the final answer `text` (its content, tool calls taken out) answers `task`, else 0."""
    answer = answer_of(task, text or "")
    if answer is None:
        return 0
    if task.kind == LOOKUP:
        return int(answer == task.expected)
    return int(int(answer) == int(task.expected))
