"""The tool dialogues: seeded, mixed as documented, and every call renders in the syntax the server reads."""

import collections
import json
import random

import pytest

from liveloop.model.tokenizer import train_tokenizer
from liveloop.model.tool_corpus import (
    CALCULATOR, DIRECT_RIGHT, LOOKUP, MIX, TABLE, TOOL_NAMES, Call, Move, ToolTask, dialogue_texts,
    generate_tool_corpus, make_dialogue, run_call, sample_task, tool_specs,
)
from liveloop.server.edge.formats.tool_parsers import PARSERS


@pytest.fixture(scope="module")
def tokenizer():
    """A small tokenizer trained on tool dialogues: the chat template is what is under test."""
    return train_tokenizer((t for d in generate_tool_corpus(200, seed=9) for t in dialogue_texts(d)), vocab_size=400)


def test_same_seed_same_dialogues_and_other_seed_differs():
    assert generate_tool_corpus(50, seed=3) == generate_tool_corpus(50, seed=3)
    assert generate_tool_corpus(50, seed=3) != generate_tool_corpus(50, seed=4)
    assert generate_tool_corpus(0, seed=3) == []


def test_tools_are_openai_function_definitions_of_both_tools():
    specs = tool_specs()
    assert [s["type"] for s in specs] == ["function", "function"]
    assert tuple(s["function"]["name"] for s in specs) == TOOL_NAMES == (CALCULATOR, LOOKUP)
    for s in specs:
        params = s["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) == set(params["properties"])
    specs[0]["function"]["name"] = "changed"
    assert tool_specs()[0]["function"]["name"] == CALCULATOR  # a fresh copy each call


def test_run_call_results_and_errors():
    assert run_call(CALCULATOR, {"a": 7, "b": 5, "op": "add"}) == "12"
    assert run_call(CALCULATOR, {"a": 7, "b": 5, "op": "multiply"}) == "35"
    assert run_call(LOOKUP, {"key": "Oslo"}) == "Norway"
    assert run_call(LOOKUP, {"key": " Oslo "}) == "Norway"
    for bad in ({"a": 7, "b": 5}, {"a": "7", "b": 5, "op": "add"}, {"a": True, "b": 5, "op": "add"},
                {"a": 7, "b": 5, "op": "divide"}, {"a": 7, "b": 5, "op": "add", "c": 1}):
        assert run_call(CALCULATOR, bad).startswith("error: calculator takes"), bad
    assert run_call(LOOKUP, {"key": "Atlantis"}) == 'error: no entry for "Atlantis"'
    assert run_call(LOOKUP, {"key": 3}).startswith("error: lookup takes")
    assert run_call("weather", {}).startswith('error: unknown tool "weather"')


def test_table_entries_do_not_contain_each_other():
    words = [*TABLE, *TABLE.values()]
    assert len(set(TABLE.values())) == len(TABLE) == 10
    assert not [(x, y) for x in words for y in words if x != y and x.lower() in y.lower()]


def test_task_answer_is_its_calls_result():
    rng = random.Random(0)
    kinds = collections.Counter()
    for _ in range(300):
        task = sample_task(rng)
        kinds[task.kind] += 1
        assert task.answer == run_call(task.call.name, task.call.arguments)
        assert not task.answer.startswith("error")
    assert 100 < kinds[CALCULATOR] < 200 and kinds[LOOKUP] == 300 - kinds[CALCULATOR]


def test_mix_and_correctness_as_documented():
    dialogues = generate_tool_corpus(3000, seed=0)
    moves = collections.Counter(d.move for d in dialogues)
    for move, weight in MIX.items():
        assert abs(moves[move] / 3000 - weight) < 0.03, (move, moves)
    assert all(d.correct for d in dialogues if d.move == Move.CORRECT_CALL)
    assert not any(d.correct for d in dialogues if d.move == Move.WRONG_CALL)
    direct = [d.correct for d in dialogues if d.move == Move.DIRECT]
    assert abs(sum(direct) / len(direct) - DIRECT_RIGHT) < 0.05
    expected = MIX[Move.CORRECT_CALL] + MIX[Move.DIRECT] * DIRECT_RIGHT  # 0.45 + 0.30 / 3 = 0.55
    assert abs(sum(d.correct for d in dialogues) / 3000 - expected) < 0.03


def test_answers_repeat_the_tool_result_and_name_the_answer_only_when_correct():
    for d in generate_tool_corpus(400, seed=1):
        final = d.messages[-1]
        assert final["role"] == "assistant" and final["content"]
        if d.move == Move.DIRECT:
            assert len(d.messages) == 2
        else:
            user, call_turn, tool, _ = d.messages
            call = call_turn["tool_calls"][0]["function"]
            assert tool["content"] == run_call(call["name"], call["arguments"]) and tool["content"] in final["content"]
            assert (call["name"], call["arguments"]) != (d.task.call.name, d.task.call.arguments) or d.correct
        # the answer is the last word: "The answer is 12." / "It is France."
        assert (final["content"].rstrip(".").split()[-1] == d.task.answer) == d.correct


def test_a_wrong_call_of_a_tie_still_misses():
    # 2 + 2 == 2 * 2: flipping the operation is no wrong call here, so another one is made
    task = ToolTask("What is 2 plus 2?", Call(CALCULATOR, {"a": 2, "b": 2, "op": "add"}), "4")
    for seed in range(30):
        d = make_dialogue(task, Move.WRONG_CALL, random.Random(seed))
        assert d.messages[2]["content"] != "4" and not d.correct


def test_every_rendered_call_parses_back_through_the_hermes_parser(tokenizer):
    parser = PARSERS["hermes"](TOOL_NAMES)
    tools = tool_specs()
    for d in generate_tool_corpus(200, seed=2):
        messages = list(d.messages)
        prompt = tokenizer.apply_chat_template(messages[:1], tools=tools, tokenize=False, add_generation_prompt=True)
        whole = tokenizer.apply_chat_template(messages[:2], tools=tools, tokenize=False)
        assert whole.startswith(prompt) and whole.endswith("<|end|>\n")
        reply = whole[len(prompt): -len("<|end|>\n")]  # what the model is trained to write
        parsed = parser.parse(reply)
        if d.move == Move.DIRECT:
            assert parsed.calls == () and parsed.content == messages[1]["content"]
            continue
        intended = messages[1]["tool_calls"][0]["function"]
        assert parsed.content is None and len(parsed.calls) == 1
        assert parsed.calls[0].name == intended["name"]
        assert json.loads(parsed.calls[0].arguments) == intended["arguments"]
        # the tool's result comes back in the next user turn, the final answer after it
        full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert f"<tool_response>\n{messages[2]['content']}\n</tool_response>" in full
        assert full.endswith(f"<|assistant|>\n{messages[3]['content']}<|end|>\n")


def test_dialogue_texts_are_plain_text():
    texts = dialogue_texts(generate_tool_corpus(1, seed=0)[0])
    assert all(isinstance(t, str) and t for t in texts)
    assert any('"name": "calculator"' in t for t in texts) and any("<tool_call>" in t for t in texts)
