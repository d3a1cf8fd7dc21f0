"""The store's parts (store/store.py): each lives in the module of its name, and no store module imports
the package `liveloop.store` or the facade at run time (tests/unit/test_import_cycles.py finds the rest)."""

from __future__ import annotations

import ast
from pathlib import Path

from liveloop.store import Store, StoreConfig
from liveloop.store.db import Part

STORE = Path(__file__).resolve().parents[3] / "store"


def test_every_part_lives_in_the_module_of_its_name(tmp_path):
    store = Store(StoreConfig(url=f"sqlite:///{tmp_path / 'parts.db'}"))
    try:
        parts = {name: part for name, part in vars(store).items() if isinstance(part, Part)}
        assert {"versions", "feedback", "keys", "rights", "release", "operator", "fleet", "conversations", "episodes"} <= set(parts)
        for name, part in parts.items():
            assert type(part).__module__ == f"liveloop.store.{name}", name
    finally:
        store.close()


def test_no_part_imports_the_package_or_the_facade():
    """Only the package itself and the modules that serve the facade's callers (the writer, the export)
    may name `liveloop.store.store`; none but the package's own __init__ imports `liveloop.store`."""
    for path in STORE.glob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module != "liveloop.store", f"{path.name}: from liveloop.store import ..."
                if node.module == "liveloop.store.store":
                    assert path.name in {"writer.py", "export.py"}, f"{path.name} imports the facade"
