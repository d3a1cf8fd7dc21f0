"""Every module of the package stays small enough to read: at most 600 lines, and a module docstring (what
the module owns) of at most 25 lines; the rationale lives next to the code it explains or in docs/. The
modules are the files pyproject.toml maps into `liveloop.*` (tests/unit/test_import_cycles.py `modules`);
bench/ scripts and tests are not modules of the package (a bench's docstring is its manual).

An exception is listed here with its reason, and the check fails when a listed one no longer needs it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .test_import_cycles import modules

MAX_LINES = 600
MAX_DOCSTRING_LINES = 25
LONG_FILES: dict[str, str] = {}  # module -> why it may be longer
LONG_DOCSTRINGS: dict[str, str] = {}  # module -> why its docstring may be longer


def _docstring_lines(source: str) -> int:
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return 0 if doc is None else doc.count("\n") + 1


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert set(long) - set(LONG_FILES) == set(), f"modules over {MAX_LINES} lines: {long}"
    assert set(LONG_FILES) <= set(long), f"listed but no longer long: {set(LONG_FILES) - set(long)}"


def test_no_module_docstring_is_over_25_lines():
    long = {name: n for name, path in modules().items() if (n := _docstring_lines(path.read_text())) > MAX_DOCSTRING_LINES}
    assert set(long) - set(LONG_DOCSTRINGS) == set(), f"module docstrings over {MAX_DOCSTRING_LINES} lines: {long}"
    assert set(LONG_DOCSTRINGS) <= set(long), f"listed but no longer long: {set(LONG_DOCSTRINGS) - set(long)}"


def test_the_design_notes_stay_a_door():
    # docs/design.md says why and points at the code and the results; it grew back past this twice
    lines = len((Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text().splitlines())
    assert lines <= 700, f"docs/design.md is {lines} lines: move detail next to the code it explains or into docs/results"


@pytest.mark.parametrize(("source", "expected"), [('"""one"""\n', 1), ('"""a\nb\nc\n"""\nx = 1\n', 4), ("x = 1\n", 0)])
def test_the_docstring_count(source, expected):
    assert _docstring_lines(source) == expected
