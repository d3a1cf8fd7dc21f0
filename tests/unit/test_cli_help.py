"""Every option and argument of every `liveloop` command says what it is for (`--help` is the manual)."""

from __future__ import annotations

import argparse

from liveloop.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "liveloop"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_has_help_text():
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, parser in _parsers(build_parser())
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not (a.help or "").strip()
    ]
    assert missing == []


def test_every_command_that_reads_a_config_takes_it_after_the_subcommand():
    leaves = [(path, p) for path, p in _parsers(build_parser()) if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]
    assert len(leaves) > 10
    without = [path for path, p in leaves if not any("--config" in a.option_strings for a in p._actions)]
    # simulate reads a scenario (`--scenario`), model import and extend a model source: no deployment config
    assert without == ["liveloop model extend", "liveloop model import", "liveloop simulate"]
