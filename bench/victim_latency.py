"""How long one key's heavy requests make another key wait: the victim's chat latency while an attacker
sends them, against the victim's own baseline measured on the same server just before (a ratio, side by
side). The attacker arms are the shapes a hostile or careless client sends:

  big_body     8 threads x 3 chat bodies of ~1 MiB of message text (refused by the character bound)
  big_tools    4 threads x 2 chats with ~1 MB of `tools` definitions and a short message
  slow_schema  2 threads x 1 chat whose `response_format` JSON schema nests bounded repeats in 8
               `pattern`s (8 s to compile on the tiny model's vocabulary: stopped at `[server]
               grammar_compile_seconds`, 3 s by default; `--server-extra "grammar_compile_seconds = 600"`
               lets it finish, as before the deadline)

The victim (another key) sends `--victim` short chats one after another while the attacker runs; its
latencies' median and max are reported with their ratio to the baseline's median. A real `liveloop
serve` on the tiny model (SQLite; `--backend`, default hf as tests/e2e/test_loop_guards.py), 2 MiB bodies
allowed so the big bodies reach the server.

    .venv/bin/python bench/victim_latency.py [--backend hf|vllm] [--arms big_body big_tools slow_schema]
        [--server-extra "[server] lines"]

Prints one JSON row per arm and saves bench/results/victim_latency.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from common import default_model, save

CHAT = "/v1/chat/completions"


def _big_body() -> dict:
    words = " ".join(f"w{i * 7919 % 100003}" for i in range(150_000))
    return {"model": "liveloop-tiny", "messages": [{"role": "user", "content": words}], "max_tokens": 4}


def _big_tools() -> dict:
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "x" * 400,
        "parameters": {"type": "object", "properties": {f"p{j}": {"type": "string", "description": "y" * 40} for j in range(8)}}}}
        for i in range(1000)]
    return {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 4}


def _slow_schema() -> dict:
    props = {f"f{i}": {"type": "string", "pattern": "^(([a-z]{1,30}[0-9]{1,30}){1,30}-){1,20}$"} for i in range(8)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    return {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "fill it"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


ARMS = {"big_body": (_big_body, 8, 3), "big_tools": (_big_tools, 4, 2), "slow_schema": (_slow_schema, 2, 1)}


def _victim_chat(client: httpx.Client) -> float:
    t = time.monotonic()
    r = client.post(CHAT, json={"model": "liveloop-tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Tell me about the sea."}]})
    r.raise_for_status()
    return time.monotonic() - t


def run_arm(base_url: str, name: str, victims: int) -> dict:
    from liveloop.devtools import USER_KEY, USER_KEY_2

    make, threads_n, per_thread = ARMS[name]
    body = json.dumps(make()).encode()
    statuses: list[int] = []
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY_2}"}, timeout=300) as victim:
        baseline = [_victim_chat(victim) for _ in range(victims)]

        def attack() -> None:  # bounded: per_thread requests
            with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=300) as c:
                for _ in range(per_thread):
                    statuses.append(c.post(CHAT, content=body, headers={"content-type": "application/json"}).status_code)

        threads = [threading.Thread(target=attack) for _ in range(threads_n)]
        for t in threads:
            t.start()
        time.sleep(0.2)  # the attack's first requests are in
        during = [_victim_chat(victim) for _ in range(victims)]
        for t in threads:
            t.join(600)
    base = statistics.median(baseline)
    return {"arm": name, "attack_bytes": len(body), "attack_requests": threads_n * per_thread,
            "attack_statuses": sorted(set(statuses)), "victim_base_p50": round(base, 4),
            "victim_p50": round(statistics.median(during), 4), "victim_max": round(max(during), 4),
            "p50_ratio": round(statistics.median(during) / base, 2), "max_ratio": round(max(during) / base, 2)}


def main() -> None:
    from liveloop.devtools import start_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="hf")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--victim", type=int, default=5, help="victim chats per phase (baseline, during)")
    parser.add_argument("--server-extra", default="", help="[server] lines for the server (e.g. grammar_compile_seconds = 600)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "srv", default_model(), args.backend, max_body_bytes=2 << 20, timeout=600,
                              server_extra=args.server_extra.replace(";", "\n"))
        try:
            for arm in args.arms:
                rows.append(run_arm(server.base_url, arm, args.victim))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.stop()
    print(f"saved {save('victim_latency', {'config': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
