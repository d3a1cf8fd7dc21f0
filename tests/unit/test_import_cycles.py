"""Import cycles among liveloop modules, found on the source: every run-time import of one liveloop
module by another (at module level or inside a function; `if TYPE_CHECKING:` imports are types only) is
an edge, and a cycle is a strongly connected group of two or more modules. The modules are the files of
every folder pyproject.toml maps into `liveloop.*`. There are none, in any package: a shared piece lives
in a leaf both sides import (the store's parts import each other's modules, never the facade; the
transport's exceptions sit in liveloop/transport/errors.py; the CLI's options in liveloop/cli_options.py).

The config loader (liveloop/config.py) reads every component's section, so it imports every component's
config module; they import the typed checks (`ConfigError`, `check_literals`, ...) from a leaf,
liveloop/config_types.py, never the loader.

    python tests/unit/test_import_cycles.py     # every cycle, largest first
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOADER = "liveloop.config"
LEAF = "liveloop.config_types"
# the section modules the loader reads (liveloop/config.py `_sections`) and the other config modules
CONFIG_MODULES = (
    "liveloop.server.config", "liveloop.store.config", "liveloop.learner.config", "liveloop.critic.config",
    "liveloop.monitor.config", "liveloop.release.config", "liveloop.model.config", "liveloop.ray_config",
    "liveloop.diffusion.config", "liveloop.server.engines.registry", "liveloop.transport.config", "liveloop.segments",
)

def modules(root: Path = ROOT) -> dict[str, Path]:
    """liveloop module name -> its file, for every folder pyproject.toml maps into the package."""
    dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, folder in dirs.items():
        base = root / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if name not in found or len(path.parts) < len(found[name].parts):  # the innermost mapping wins
                found[name] = path
    return found


def _typing_only(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the liveloop modules it imports at run time (`from a.b import c`: a.b, and a.b.c when
    that is a module)."""

    def resolve(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for name, path in found.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _typing_only(tree)
        targets: list[str] = []
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
                continue
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif node.module and node.level == 0:
                targets += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        edges[name] = {t for t in map(resolve, (t for t in targets if t.split(".")[0] == "liveloop")) if t and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges)))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(groups, key=lambda g: (-len(g), g))


def test_no_package_has_an_import_cycle():
    found = modules()
    assert {LOADER, LEAF, *CONFIG_MODULES} <= set(found)
    groups = cycles(graph(found))
    assert groups == [], "run-time import cycles:\n" + "\n".join(" ".join(g) for g in groups)


def test_the_typed_checks_are_a_leaf():
    """liveloop/config_types.py imports no liveloop module: any config module may import it."""
    found = modules()
    assert graph(found)[LEAF] == set()


def test_every_section_module_of_the_loader_is_checked():
    from liveloop.config import _sections

    assert {cls.__module__ for cls in _sections().values()} <= set(CONFIG_MODULES)


def test_the_finder_sees_a_cycle(tmp_path):
    """A cycle through a function-level import is found; a TYPE_CHECKING import is no edge."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"liveloop" = "pkg"\n"liveloop.comp" = "comp"\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "comp").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/loader.py").write_text("def sections():\n    from liveloop.comp.config import A\n")
    (tmp_path / "comp/__init__.py").write_text("")
    (tmp_path / "comp/config.py").write_text("from liveloop.loader import ConfigError\n")
    (tmp_path / "comp/other.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from liveloop.comp.more import X\n")
    (tmp_path / "comp/more.py").write_text("import liveloop.comp.other\n")
    assert cycles(graph(modules(tmp_path))) == [["liveloop.comp.config", "liveloop.loader"]]


if __name__ == "__main__":
    found = modules()
    groups = cycles(graph(found))
    print(f"{len(found)} modules, {len(groups)} import cycles, {sum(map(len, groups))} modules in them")
    for group in groups:
        print(len(group), " ".join(group))
