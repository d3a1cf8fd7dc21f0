"""vLLM's own process group stays on loopback: the engine's environment makes vLLM take 127.0.0.1 for
its address (left alone it takes the default route's interface, e.g. 192.0.2.2 on this machine) and
gloo the loopback interface, unless the operator set them. In a fresh interpreter: the environment is
the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, os
from liveloop.server.config import EngineConfig
from liveloop.server.engines.vllm.engine import _cpu_env
_cpu_env(EngineConfig())
from vllm.utils.network_utils import get_ip
print(json.dumps([get_ip(), os.environ.get("GLOO_SOCKET_IFNAME")]))
"""


def _probe(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME")}
    out = subprocess.run([sys.executable, "-c", PROBE], env=base | env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vllm_takes_loopback_for_its_group():
    assert _probe() == ["127.0.0.1", "lo"]


def test_an_operators_choice_stands():
    assert _probe(VLLM_HOST_IP="10.1.2.3", GLOO_SOCKET_IFNAME="eth7") == ["10.1.2.3", "eth7"]


def test_vllms_grammar_cache_is_bounded_as_liveloops():
    """vLLM reads VLLM_XGRAMMAR_CACHE_MB for its compiled-grammar cache (512 MB by default): the engine's
    environment bounds it as liveloop/grammar.py bounds its own (64 MiB)."""
    probe = ("import os, vllm.envs as e\nfrom liveloop.server.config import EngineConfig\n"
             "from liveloop.server.engines.vllm.engine import _cpu_env\n_cpu_env(EngineConfig())\nprint(e.VLLM_XGRAMMAR_CACHE_MB)")
    base = {k: v for k, v in os.environ.items() if k != "VLLM_XGRAMMAR_CACHE_MB"}
    out = subprocess.run([sys.executable, "-c", probe], env=base, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "64"
