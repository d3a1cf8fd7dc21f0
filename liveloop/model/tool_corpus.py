"""Tool-use dialogues for the embedded default model, and the two tools they use.

Owns the tools (a `calculator` that adds or multiplies two small integers, and a `lookup` table of ten
cities -> countries), their OpenAI `tools` definitions, what running a call returns (an error text for
an unknown tool or bad arguments, never an exception), the task questions with their correct call and
expected answer, and the dialogue mix. It is the one source of truth for the tools: the build's corpus
(`liveloop.model.build`, opt-in through `ModelBuildConfig.tool_fraction`) and the simulated environment
(`liveloop.clients.tool_env`) both read them from here. Knows nothing about tokens, templates or models:
a dialogue is OpenAI chat messages, which the chat template (`liveloop.model.tokenizer`) renders.

The mix, so that the built model calls tools sometimes and often wrongly (`MIX`):
  * 45% a correct call: user question -> assistant calls the right tool with the right arguments ->
    tool result -> assistant answers with the result;
  * 25% a call with wrong arguments (the other operation, an operand a little off, another city) ->
    the wrong call's result -> the assistant repeats that wrong result as its answer;
  * 30% an answer without a tool, right only one time in three (`DIRECT_RIGHT`), else a near miss
    (a number a little off or the other operation's result; another country).
So 55% of the corpus's final answers are right, and every answer after a tool result copies it.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CALCULATOR = "calculator"
LOOKUP = "lookup"
OPS: tuple[str, ...] = ("add", "multiply")
OPERAND_RANGE = (2, 15)  # the questions' integers, both ends included

# city -> country; every country differs, and no city or country is a substring of another entry
TABLE: dict[str, str] = {
    "Paris": "France", "Tokyo": "Japan", "Cairo": "Egypt", "Lima": "Peru", "Oslo": "Norway",
    "Rome": "Italy", "Lagos": "Nigeria", "Hanoi": "Vietnam", "Quito": "Ecuador", "Dublin": "Ireland",
}

_TOOLS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": CALCULATOR, "description": "Add or multiply two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}, "op": {"type": "string", "enum": list(OPS)}},
            "required": ["a", "b", "op"]}}},
    {"type": "function", "function": {
        "name": LOOKUP, "description": "The country a city is in.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
)
TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in _TOOLS)


def tool_specs() -> list[dict[str, Any]]:
    """The OpenAI `tools` list offering both tools (a fresh copy each call)."""
    return json.loads(json.dumps(_TOOLS))


class Move(enum.StrEnum):
    """What the assistant does with a question in a corpus dialogue."""

    CORRECT_CALL = "correct_call"
    WRONG_CALL = "wrong_call"
    DIRECT = "direct"


MIX: dict[Move, float] = {Move.CORRECT_CALL: 0.45, Move.WRONG_CALL: 0.25, Move.DIRECT: 0.30}
DIRECT_RIGHT = 1 / 3  # how often a direct answer is right

_QUESTIONS: dict[str, tuple[str, ...]] = {
    "add": ("What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "What do {a} and {b} add up to?"),
    "multiply": ("What is {a} times {b}?", "Multiply {a} by {b}.", "What is {a} * {b}?",
                 "What is the product of {a} and {b}?"),
    LOOKUP: ("Which country is {key} in?", "In which country is {key}?", "{key} is a city in which country?",
             "What country is {key} in?"),
}
_ANSWERS = ("The answer is {x}.", "It is {x}.")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolTask:
    """A question, the call that answers it, and the answer a user would accept."""

    question: str
    call: Call  # the correct call
    answer: str

    @property
    def kind(self) -> str:
        """The tool the task needs: `calculator` or `lookup`."""
        return self.call.name


@dataclass(frozen=True)
class ToolDialogue:
    task: ToolTask
    move: Move
    messages: tuple[dict[str, Any], ...]  # OpenAI chat messages, the tools offered by `tool_specs()`
    correct: bool  # whether the final answer is the task's answer


def run_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The text a tool returns for a call; an `error: ...` text for an unknown tool or bad arguments."""
    if name == CALCULATOR:
        a, b, op = arguments.get("a"), arguments.get("b"), arguments.get("op")
        if set(arguments) != {"a", "b", "op"} or not (_is_int(a) and _is_int(b)) or op not in OPS:
            return "error: calculator takes integers a and b and op 'add' or 'multiply'"
        return str(a + b if op == "add" else a * b)
    if name == LOOKUP:
        key = arguments.get("key")
        if set(arguments) != {"key"} or not isinstance(key, str):
            return "error: lookup takes a string key"
        return TABLE.get(key.strip(), f"error: no entry for {json.dumps(key)}")
    return f"error: unknown tool {json.dumps(name)}; the tools are {', '.join(TOOL_NAMES)}"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def sample_task(rng: random.Random) -> ToolTask:
    """A calculator question (half of them, add or multiply equally) or a lookup question."""
    if rng.random() < 0.5:
        key = rng.choice(tuple(TABLE))
        call = Call(LOOKUP, {"key": key})
        question = rng.choice(_QUESTIONS[LOOKUP]).format(key=key)
    else:
        op = rng.choice(OPS)
        a, b = rng.randint(*OPERAND_RANGE), rng.randint(*OPERAND_RANGE)
        call = Call(CALCULATOR, {"a": a, "b": b, "op": op})
        question = rng.choice(_QUESTIONS[op]).format(a=a, b=b)
    return ToolTask(question, call, run_call(call.name, call.arguments))


def _wrong_call(task: ToolTask, rng: random.Random) -> Call:
    """A call of the right tool whose result is not the answer."""
    if task.kind == LOOKUP:
        return Call(LOOKUP, {"key": rng.choice([k for k in TABLE if TABLE[k] != task.answer])})
    args = task.call.arguments
    for _ in range(20):
        wrong = dict(args)
        if rng.random() < 0.4:
            wrong["op"] = OPS[1 - OPS.index(args["op"])]
        else:
            side = rng.choice(("a", "b"))
            wrong[side] = max(0, args[side] + rng.choice((-3, -2, -1, 1, 2, 3)))
        if run_call(CALCULATOR, wrong) != task.answer:
            return Call(CALCULATOR, wrong)
    return Call(CALCULATOR, dict(args, a=args["a"] + 1))  # b >= 2, so this changes a + b and a * b


def _wrong_answer(task: ToolTask, rng: random.Random) -> str:
    """A near miss: another country, or a number a little off or the other operation's result."""
    if task.kind == LOOKUP:
        return rng.choice([c for c in TABLE.values() if c != task.answer])
    args = task.call.arguments
    other = run_call(CALCULATOR, dict(args, op=OPS[1 - OPS.index(args["op"])]))
    if rng.random() < 0.3 and other != task.answer:
        return other
    return str(max(0, int(task.answer) + rng.choice((-5, -3, -2, -1, 1, 2, 3, 5))))


def make_dialogue(task: ToolTask, move: Move, rng: random.Random) -> ToolDialogue:
    """The messages of one dialogue on `task` in which the assistant makes `move`."""
    user = {"role": "user", "content": task.question}
    answer_text = rng.choice(_ANSWERS)
    if move == Move.DIRECT:
        x = task.answer if rng.random() < DIRECT_RIGHT else _wrong_answer(task, rng)
        return ToolDialogue(task, move, (user, {"role": "assistant", "content": answer_text.format(x=x)}),
                            x == task.answer)
    call = task.call if move == Move.CORRECT_CALL else _wrong_call(task, rng)
    result = run_call(call.name, call.arguments)
    messages = (
        user,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": call.name, "arguments": dict(call.arguments)}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": call.name, "content": result},
        {"role": "assistant", "content": answer_text.format(x=result)},
    )
    return ToolDialogue(task, move, messages, result == task.answer)


def generate_tool_corpus(n: int, seed: int) -> list[ToolDialogue]:
    """`n` dialogues on seeded tasks, their moves drawn by `MIX`."""
    rng = random.Random(seed)
    moves, weights = list(MIX), list(MIX.values())
    return [make_dialogue(sample_task(rng), rng.choices(moves, weights)[0], rng) for _ in range(n)]


_MARKUP = "<tools>\n</tools>\n<tool_call>\n</tool_call>\n<tool_response>\n</tool_response>"


def dialogue_texts(dialogue: ToolDialogue) -> list[str]:
    """The texts a tokenizer should learn from a dialogue: the messages and the JSON the template writes."""
    texts = [_MARKUP] + [json.dumps(t["function"]) for t in tool_specs()]
    for m in dialogue.messages:
        if m.get("content"):
            texts.append(m["content"])
        for c in m.get("tool_calls", ()):
            f = c["function"]
            texts.append(json.dumps({"name": f["name"], "arguments": f["arguments"]}))
    return texts
