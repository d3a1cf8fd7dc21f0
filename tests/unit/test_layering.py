"""The intended import arrows between the components, checked on the source: every import of one
component from another (at module level or inside a function; `if TYPE_CHECKING:` imports are types
only and are not arrows) must be an arrow of `ALLOWED`. `server/` and `learner/` never import each
other (they meet only in the store), the transport imports neither, and the store and the RL core
import no other component. The wiring (`liveloop/app.py`, `liveloop/cli.py`, the config loader) may
import anything; the shared helpers beside it (`liveloop/checkpoint.py`, `liveloop/segments.py`, ...)
may import no component.

Inside `server/` the three rooms have their own arrows (`ROOMS`): the HTTP edge (`server/edge/`) may
use the version control plane (`server/control/`) and the engines (`server/engines/`); the control
plane never imports the edge; the engines import neither. `server/config.py` (the server's typed
settings) is shared by all three. Inside the edge, the generation pipeline imports no endpoint folder,
no endpoint folder imports another (`ENDPOINT_EXCEPTIONS` names the one that does, and why), and the
routes' dependencies (server/edge/dependencies.py) hold no control-plane object: each route takes its
endpoint's handler, built with what it uses."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# component -> the folder it lives in (installed as liveloop.<component>)
COMPONENTS = {
    "rl": "rl", "store": "store", "transport": "liveloop/transport", "monitor": "monitor", "critic": "critic",
    "diffusion": "diffusion", "learner": "learner", "server": "server", "clients": "clients", "release": "release",
}
ALLOWED = {
    "rl": set(),
    "store": set(),
    "transport": {"store"},
    "monitor": {"store"},
    "critic": {"rl"},
    "diffusion": {"rl", "store"},
    "learner": {"rl", "critic", "store", "transport"},
    "server": {"store", "transport", "monitor", "diffusion", "release"},
    "release": {"store", "monitor", "transport"},
    "clients": set(),
}
# server/'s rooms -> the rooms each may import (server/config.py is every room's)
ROOMS = {
    "edge": {"control", "engines"},
    "control": {"engines"},
    "engines": set(),
}
# top-level modules both sides share: they import no component at run time
SHARED = ("checkpoint.py", "segments.py", "metrics.py", "provenance.py", "grammar.py", "episodes.py", "private.py", "home.py",
          "lexicon.py", "rewards.py", "cli_options.py", "config_types.py", "sampling.py")


def _component(module: str) -> str | None:
    for name in COMPONENTS:
        if module == f"liveloop.{name}" or module.startswith(f"liveloop.{name}."):
            return name
    return None


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every run-time import of a liveloop module in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = _type_checking_lines(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "liveloop"]
    return [(line, m) for line, m in found if m == "liveloop" or m.startswith("liveloop.")]


def arrows() -> list[tuple[str, str, str]]:
    """(from component, to component, where) for every cross-component import in the source."""
    out = []
    for name, folder in COMPONENTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in imports(path):
                target = _component(module)
                if target is not None and target != name:
                    out.append((name, target, f"{path.relative_to(ROOT)}:{line} imports {module}"))
    return out


def test_the_allowed_arrows_have_no_cycle():
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        assert seen.get(node) != 1, f"cycle: {' -> '.join(path + [node])}"
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for nxt in ALLOWED[node]:
            visit(nxt, path + [node])
        seen[node] = 2

    for node in ALLOWED:
        visit(node, [])


def test_every_import_between_components_is_an_allowed_arrow():
    wrong = [where for src, dst, where in arrows() if dst not in ALLOWED[src]]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _room(module: str) -> str | None:
    for room in ROOMS:
        if module == f"liveloop.server.{room}" or module.startswith(f"liveloop.server.{room}."):
            return room
    return None


def room_arrows() -> list[tuple[str, str, str]]:
    """(from room, to room, where) for every import between server/'s rooms."""
    out = []
    for room in ROOMS:
        for path in sorted((ROOT / "server" / room).rglob("*.py")):
            for line, module in imports(path):
                target = _room(module)
                if target is not None and target != room:
                    out.append((room, target, f"{path.relative_to(ROOT)}:{line} imports {module}"))
    return out


def test_every_import_between_the_servers_rooms_is_an_allowed_arrow():
    found = room_arrows()
    assert {(src, dst) for src, dst, _ in found} >= {("edge", "control"), ("edge", "engines"), ("control", "engines")}
    wrong = [where for src, dst, where in found if dst not in ROOMS[src]]
    assert not wrong, "imports against the server's rooms:\n" + "\n".join(wrong)


def test_every_server_module_lives_in_a_room():
    """server/ holds its rooms and what they share (the package, its config): a new module goes
    into a room, not beside them."""
    loose = sorted(p.name for p in (ROOT / "server").glob("*.py"))
    assert loose == ["__init__.py", "config.py"], loose


def test_the_shared_modules_import_no_component():
    wrong = [
        f"liveloop/{name}:{line} imports {module}"
        for name in SHARED
        for line, module in imports(ROOT / "liveloop" / name)
        if _component(module) is not None
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_forbidden_arrow(tmp_path):
    """The scan finds imports in functions and skips TYPE_CHECKING ones (so the tests above can fail)."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from liveloop.learner.config import LearnerConfig\n"
        "def f():\n    from liveloop.learner.segments import lanes\n    import liveloop.server.app\n"
    )
    assert [m for _, m in imports(src)] == ["liveloop.learner.segments", "liveloop.server.app"]


@pytest.mark.parametrize("preset", ["default", "production"])
def test_loading_a_config_imports_no_torch(preset):
    code = (
        "import sys\nfrom liveloop.config import load_config\n"
        f"load_config({preset!r})\n"
        "import liveloop.transport\n"
        "heavy = [m for m in ('torch', 'transformers', 'ray', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# -- inside the edge ------------------------------------------------------------------------------------
EDGE = ROOT / "server" / "edge"
ENDPOINTS = ("chat", "completions", "messages", "responses", "feedback", "tokens", "admin", "versions", "models", "ops")
# (importer, imported) endpoint folders allowed: vLLM's /tokenize takes chat messages and tools exactly as
# /v1/chat/completions does, so tokens/protocol.py builds on chat/protocol.py's request models
ENDPOINT_EXCEPTIONS = {("tokens", "chat")}


def _endpoint(module: str) -> str | None:
    for name in ENDPOINTS:
        if module == f"liveloop.server.edge.{name}" or module.startswith(f"liveloop.server.edge.{name}."):
            return name
    return None


def test_the_pipeline_imports_no_endpoint_folder():
    """The generation every endpoint shares knows none of them: each endpoint prepares its own request."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((EDGE / "pipeline").rglob("*.py"))
        for line, module in imports(path)
        if _endpoint(module) is not None
    ]
    assert not wrong, "\n".join(wrong)


def test_no_endpoint_folder_imports_another():
    wrong = []
    for name in ENDPOINTS:
        for path in sorted((EDGE / name).rglob("*.py")):
            for line, module in imports(path):
                target = _endpoint(module)
                if target is not None and target != name and (name, target) not in ENDPOINT_EXCEPTIONS:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "endpoint folders importing each other:\n" + "\n".join(wrong)


def _classes(folder: Path) -> set[str]:
    return {
        node.name
        for path in folder.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ClassDef)
    }


def fields_named_after(path: Path, classes: set[str]) -> list[str]:
    """`Class.field: Type` of every class field in `path` whose annotation names one of `classes`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                named = {n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name)}
                named |= {n.attr for n in ast.walk(item.annotation) if isinstance(n, ast.Attribute)}
                if isinstance(item.annotation, ast.Constant) and isinstance(item.annotation.value, str):
                    named |= set(re.findall(r"\w+", item.annotation.value))
                if named & classes:
                    found.append(f"{node.name}.{item.target.id}: {ast.unparse(item.annotation)}")
    return found


def test_the_routes_dependencies_hold_no_control_plane_object():
    """What the routes are handed is their handlers, not the control plane's objects (`Parts` was)."""
    wrong = fields_named_after(EDGE / "dependencies.py", _classes(ROOT / "server" / "control"))
    assert not wrong, "fields of server/edge/dependencies.py typed with a control-plane class:\n" + "\n".join(wrong)


def test_the_field_check_sees_a_control_plane_field(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class Parts:\n    activator: Activator\n    gate: 'ReleaseGate | None'\n    keys: KeyRing\n")
    assert fields_named_after(src, {"Activator", "ReleaseGate"}) == ["Parts.activator: Activator", "Parts.gate: 'ReleaseGate | None'"]
