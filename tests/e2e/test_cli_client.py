"""The client commands against a real server: a wrong key is one line on stderr and exit 1, never a
traceback or a loop that asks again (`liveloop chat`, `liveloop versions`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def run(*args, stdin: str = ""):
    return subprocess.run([sys.executable, "-m", "liveloop.cli", *args], input=stdin, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["versions", "chat"])
def test_a_wrong_key_is_one_line_and_exit_1(vllm_server, command):
    out = run(command, "--base-url", vllm_server.base_url, "--api-key", "sk-wrong", stdin="hello\nhello again\n")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stderr.strip().splitlines() == ["liveloop: HTTP 401: incorrect API key provided"]
    assert "Traceback" not in out.stdout + out.stderr and out.stdout.count("bot>") <= 1
