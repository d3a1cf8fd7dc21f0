"""The `--config` option every `liveloop` command that reads the deployment config shares: its default
preset and help, and `config_option` for a subcommand's parser. A leaf, so the command modules
(liveloop/cli.py, liveloop/operator_cli.py) both import it and neither imports the other back.
"""

from __future__ import annotations

import argparse

DEFAULT_CONFIG = "default"  # the preset configs/serve/default.toml
CONFIG_HELP = "a preset name in configs/ (default, production, ...) or a path to a TOML file (default: %(default)s)"


def config_option(p: argparse.ArgumentParser) -> None:
    """`--config` after the subcommand too (`liveloop serve --config x.toml`); it wins over the global one."""
    p.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP.replace("%(default)s", DEFAULT_CONFIG))
