"""The edge's constraint check with a deadline (server/edge/pipeline/grammar_check.py), on the tiny
model's tokenizer and the real xgrammar in a real child process: a constraint that compiles passes, one
that cannot is InvalidConstraint, and one whose compile runs past the deadline (nested bounded repeats
in a `pattern`) is stopped (the child killed) as GrammarTooComplex, after which a fresh child starts at
once in the background and the next check passes on it; `start` readies a child before any check; a
check after `close` (the server stopping) is CheckerUnavailable, the server's state, not the schema's."""

from __future__ import annotations

import time

import psutil
import pytest

from liveloop.grammar import InvalidConstraint, grammars_for
from liveloop.server.edge.formats.tools import json_constraint
from liveloop.server.edge.pipeline.grammar_check import GrammarChecker, GrammarTooComplex

# each property's pattern nests bounded repeats: xgrammar expands them into a large automaton (8 such
# properties: 8 s on the tiny model's 1,024-token vocabulary on this machine, SmolLM2's took 21 s for 4
# of a smaller one); the deadline the test stops it at is 40 times shorter
SLOW_PATTERN = "^(([a-z]{1,30}[0-9]{1,30}){1,30}-){1,20}$"


def _schema(pattern: str | None, n: int = 4) -> str:
    prop = {"type": "string"} if pattern is None else {"type": "string", "pattern": pattern}
    schema = {"type": "object", "properties": {f"p{i}": prop for i in range(n)}, "required": [f"p{i}" for i in range(n)]}
    return json_constraint(schema, "canonical")


@pytest.fixture
def checker(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    c = GrammarChecker(grammars_for(str(model_dir), len(tokenizer), tokenizer).info, deadline_seconds=60.0)
    yield c
    c.close()


def test_a_constraint_that_compiles_passes_and_one_that_cannot_is_invalid(checker):
    checker.check(_schema(None))
    with pytest.raises(InvalidConstraint) as refused:
        checker.check('{"type": "not a structural tag"}')
    assert not isinstance(refused.value, GrammarTooComplex)
    checker.check(_schema(None, 2))  # the child survived the refusal
    assert checker.stopped == 0


def test_a_compile_past_the_deadline_is_stopped_and_the_next_check_has_a_fresh_child(checker):
    checker.check(_schema(None))
    first = checker.pid
    checker.deadline = 0.2
    with pytest.raises(GrammarTooComplex, match="did not compile within 0.2 s"):
        checker.check(_schema(SLOW_PATTERN, 8))
    assert checker.stopped == 1
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE  # killed, not left compiling
    standby = _wait_for_child(checker)  # its successor starts without a check asking for it
    assert standby != first
    checker.deadline = 60.0
    checker.check(_schema(None))
    assert checker.pid == standby


def test_start_readies_a_child_before_the_first_check(checker):
    assert checker.pid is None
    checker.start().join(60)
    pid = checker.pid
    assert pid is not None
    checker.check(_schema(None))
    assert checker.pid == pid


def test_a_closed_checker_starts_no_child(checker):
    checker.close()
    starting = checker.start()
    starting.join(60)
    assert not starting.is_alive() and checker.pid is None
    with pytest.raises(RuntimeError, match="closed"):  # a check that waited out the close starts none either
        checker.check(_schema(None))
    assert checker.pid is None


def _wait_for_child(checker: GrammarChecker, timeout: float = 60.0) -> int:
    """The pid of the checker's ready child, once its background start is done (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with checker._lock:  # the start holds it until the child answered ready
            if checker.pid is not None:
                return checker.pid
        time.sleep(0.05)
    raise AssertionError("no child started")


def test_a_check_after_close_is_the_server_stopping_not_the_schemas_fault(checker):
    """A 503 at the edge (tests/unit/server/edge/test_errors.py), not the 400 of a schema that cannot be followed."""
    from liveloop.server.edge.pipeline.grammar_check import CheckerUnavailable

    checker.check(_schema(None))
    checker.close()  # the server's shutdown, with a request still on its way to the grammar thread
    with pytest.raises(CheckerUnavailable, match="stopping") as stopped:
        checker.check(_schema(None))
    assert not isinstance(stopped.value, InvalidConstraint)


def test_the_prompter_passes_the_stopping_on_to_the_edge(model_dir):
    """What the edge calls (`Prompter.check`): a closed checker stays CheckerUnavailable, not the 400 of a
    schema that cannot be followed (ToolsRefused)."""
    from transformers import AutoTokenizer

    from liveloop.server.edge.pipeline.grammar_check import CheckerUnavailable
    from liveloop.server.edge.pipeline.prompting import Prompter

    prompter = Prompter(AutoTokenizer.from_pretrained(str(model_dir)), model_dir, "auto", "canonical", None)
    prompter.check(_schema(None), "response_format")
    prompter.close()
    with pytest.raises(CheckerUnavailable):
        prompter.check(_schema(None), "response_format")
