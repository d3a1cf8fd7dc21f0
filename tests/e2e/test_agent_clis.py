"""The agent CLIs people run, unchanged, against a real server on the agents preset (configs/serve/
agents.toml: the tests' model extended to a long context, vLLM with its prefix cache, `store: false`
turns kept as tokens, a reply to the user's turn made to call a tool): Codex CLI (`codex exec`, the
Responses API) and Claude Code (`claude -p`, the Messages API), at the versions requirements/agents/
pins (installed by scripts/agents.sh; skipped, saying so, only where npm is missing).

Each runs one session with a tool call and its result, rated by the hook clients/ ships (Codex's
`notify` program, Claude Code's `Stop` hook). What the store must hold afterwards: the session's turns
linked into one episode, the tool result between them observation (not action) tokens, any side call
outside the episode, and the session's rating trained once by the learner."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import ADMIN_KEY, ServerProcess

from .conftest import AGENTS_MODEL as MODEL
from .conftest import USER_KEY, open_store, start_agents_server

pytestmark = [pytest.mark.vllm, pytest.mark.learning]  # beside the learning tests: its learner trains a whole session

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def _bin(name: str) -> str:
    where = os.environ.get("LIVELOOP_AGENTS_BIN") or str(ROOT / ".agents" / "node_modules" / ".bin")
    path = Path(where) / name
    if not path.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: the agent CLIs cannot be (scripts/agents.sh)")
        pytest.fail(f"{path} is missing: run scripts/agents.sh (scripts/test.sh does)")
    return str(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir) -> ServerProcess:
    """`liveloop serve` on the agents preset with a learner that publishes after every step."""
    srv = start_agents_server(tmp_path_factory.mktemp("agent-clis"), model_dir,
                              learner="publish_every_steps = 1\npublish_every_seconds = 0.5\npoll_seconds = 0.2\n")
    yield srv
    srv.stop()


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("The meeting moved to Thursday.\n")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    return work


def _run(cmd: list[str], cwd: Path, env: dict[str, str], server: ServerProcess) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE"))}
    done = subprocess.run(cmd, cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{cmd[0]} exited {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}\nserver:\n{server.log_tail(40)}"
    return done


def _rows(server: ServerProcess, endpoint: str) -> list[tuple[str, str | None]]:
    """(id, parent_id) of every stored response of `endpoint` (the test's SQLite store, read directly)."""
    with sqlite3.connect(server.store_url.removeprefix("sqlite:///")) as db:
        return db.execute("SELECT id, parent_id FROM responses WHERE endpoint = ? ORDER BY created_at", (endpoint,)).fetchall()


def _versions(server: ServerProcess) -> list:
    store = open_store(server)
    try:
        return store.versions.list_versions()
    finally:
        store.close()


def test_codex_exec_runs_a_tool_and_its_session_is_one_rated_episode(server, tmp_path):
    codex = _bin("codex")
    work = _workdir(tmp_path)
    home = tmp_path / "codex-home"
    home.mkdir()
    notify = [sys.executable, str(ROOT / "clients" / "codex_notify.py")]
    (home / "config.toml").write_text(f"""model = "{MODEL}"
model_provider = "liveloop"
notify = {json.dumps(notify)}
[model_providers.liveloop]
name = "liveloop"
base_url = "{server.base_url}/v1"
env_key = "LIVELOOP_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
""")
    env = {"CODEX_HOME": str(home), "HOME": str(tmp_path), "LIVELOOP_API_KEY": USER_KEY, "LIVELOOP_BASE_URL": server.base_url,
           "LIVELOOP_RATING": "up", "LIVELOOP_HOOK_STATE": str(tmp_path / "hook-state")}
    before = len(_versions(server))
    done = _run([codex, "exec", "--skip-git-repo-check", "Read notes.txt and tell me what it says."], work, env, server)
    check_session(server, "responses", before, done)


def test_claude_code_runs_a_tool_and_its_session_is_one_rated_episode(server, tmp_path):
    claude = _bin("claude")
    work = _workdir(tmp_path)
    hook = f"{sys.executable} {ROOT / 'clients' / 'claude_code_stop.py'}"
    settings = tmp_path / ".claude"
    settings.mkdir()
    (settings / "settings.json").write_text(json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": hook}]}]}}))
    env = {"HOME": str(tmp_path), "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": USER_KEY,
           "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL, "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "LIVELOOP_BASE_URL": server.base_url, "LIVELOOP_API_KEY": USER_KEY, "LIVELOOP_RATING": "up",
           "LIVELOOP_HOOK_STATE": str(tmp_path / "hook-state")}
    before = len(_versions(server))
    done = _run([claude, "-p", "Read notes.txt and tell me what it says.", "--model", MODEL, "--tools", "Read", "--max-turns", "4"],
                work, env, server)
    check_session(server, "messages", before, done)


def check_session(server: ServerProcess, endpoint: str, published_before: int, done: subprocess.CompletedProcess) -> None:
    """The session the CLI just ran: one episode of two turns or more, the first a tool call, the tool's
    result observation tokens before the second; side calls (if the CLI made any) in no episode; the
    hook's rating on its last turn, trained by the learner. Codex starts its `notify` program and does not
    wait for it, so the rating is waited for (bounded), not expected the moment the CLI exits."""
    deadline = time.monotonic() + 120
    while True:
        episodes = httpx.get(f"{server.base_url}/admin/episodes?limit=50", headers=ADMIN, timeout=60).json()["data"]
        store = open_store(server)
        try:
            ours = [e for e in episodes if store.feedback.get_response(e["last_turn"]).endpoint == endpoint]
        finally:
            store.close()
        assert len(ours) == 1, (ours, done.stdout[-2000:])
        if ours[0]["ratings"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    episode = ours[0]
    turns = episode["turns"]
    assert len(turns) >= 2 and episode["complete"], episode
    assert all(t["linked_by"] is not None and t["observation_tokens"] > 0 for t in turns[1:]), turns  # the tool's result
    if endpoint == "messages":
        assert turns[0]["tool_calls"], turns[0]
    assert episode["reward"] == 1 and episode["ratings"] == 1, episode  # the hook rated the session's last turn
    in_episode = {t["id"] for t in turns}
    others = [(i, parent) for i, parent in _rows(server, endpoint) if i not in in_episode]
    assert all(parent is None for _, parent in others), others  # side calls stand apart
    deadline = time.monotonic() + 1200
    while len(_versions(server)) <= published_before:
        assert time.monotonic() < deadline, f"the learner did not train the session's rating:\n{server.log_tail(40)}"
        time.sleep(1)
    newest = _versions(server)[-1]
    assert newest.samples_used == 1, newest  # the whole session is one sample, trained once
