"""The simulated tool environment: seeded tasks, tool calls that never raise, binary ratings."""

import json

import pytest

from liveloop.clients.tool_env import EnvTask, answer_of, rate, run_tool, sample
from liveloop.model.tool_corpus import CALCULATOR, LOOKUP, Move, generate_tool_corpus, tool_specs


def _task(kind: str):
    return next(t for t in map(sample, range(100)) if t.kind == kind)


def test_same_seed_same_task_and_tasks_vary():
    assert sample(7) == sample(7)
    tasks = [sample(s) for s in range(60)]
    assert len({t.question for t in tasks}) > 40
    assert {t.kind for t in tasks} == {CALCULATOR, LOOKUP}


def test_a_task_offers_the_tools_and_its_call_gives_its_answer():
    for seed in range(50):
        task = sample(seed)
        assert task.tools == tool_specs()
        assert task.messages() == [{"role": "user", "content": task.question}]
        call = task.task.call
        assert run_tool(call.name, call.arguments) == task.expected
        assert run_tool(call.name, json.dumps(call.arguments)) == task.expected  # as the model writes it


@pytest.mark.parametrize("name, arguments, error", [
    ("calculator", '{"a": 2, "b": ', "not JSON"),
    ("calculator", "[1, 2]", "must be a JSON object"),
    ("calculator", '"add"', "must be a JSON object"),
    ("calculator", None, "calculator takes"),
    ("calculator", "", "calculator takes"),
    ("calculator", '{"a": 2, "b": 3, "op": "subtract"}', "calculator takes"),
    ("calculator", '{"a": 2.5, "b": 3, "op": "add"}', "calculator takes"),
    ("lookup", '{"key": "Atlantis"}', "no entry"),
    ("lookup", '{"city": "Paris"}', "lookup takes"),
    ("search", "{}", "unknown tool"),
    (None, "{}", "name must be a string"),
])
def test_bad_calls_are_error_texts_not_exceptions(name, arguments, error):
    result = run_tool(name, arguments)
    assert result.startswith("error:") and error in result


def test_rating_reads_the_last_answer_like_a_user():
    add = next(t for t in map(sample, range(200)) if t.kind == CALCULATOR)
    n = int(add.expected)
    assert rate(add, f"The answer is {n}.") == 1
    assert rate(add, f"{n}") == 1
    assert rate(add, f"I think it is {n - 1}, no wait, {n}.") == 1  # the last number counts
    assert rate(add, f"{n} or maybe {n + 1}") == 0
    assert rate(add, f"The answer is {n}0.") == 0 and rate(add, f"It is 1{n}.") == 0
    assert rate(add, f"It is {n}.5") == 0 and rate(add, f"It is -{n}.") == 0
    assert rate(add, "") == 0 and rate(add, None) == 0 and rate(add, "I don't know.") == 0
    country = _task(LOOKUP)
    assert rate(country, f"It is {country.expected}.") == 1
    assert rate(country, f"it is {country.expected.lower()}") == 1
    other = next(c for c in ("France", "Japan") if c != country.expected)
    assert rate(country, f"Not {country.expected} but {other}.") == 0
    assert rate(country, f"{country.expected}n") == 0  # whole words only
    assert answer_of(country, "Nothing here.") is None


def test_the_corpus_dialogues_rate_as_they_are_marked():
    """One source of truth: the corpus's own dialogues, replayed through the environment."""
    for i, d in enumerate(generate_tool_corpus(300, seed=5)):
        task = EnvTask.of(d.task, seed=i)
        if d.move != Move.DIRECT:
            call = d.messages[1]["tool_calls"][0]["function"]
            assert run_tool(call["name"], json.dumps(call["arguments"])) == d.messages[2]["content"]
        assert rate(task, d.messages[-1]["content"]) == int(d.correct)
