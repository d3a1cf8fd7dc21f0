"""The agent task through the served path: a real server (hf engine, the agent model, SAO in its learner
actor, the agent experiment's learner settings) and the official `openai` client's tool loop, the client
running the tools (clients/tool_env.py) and sending a thumbs on each final answer. The server links each
loop's turns into one episode; the learner trains it and publishes; the engine swaps versions in.

Reported: the accuracy of the served answers per window of `--window` episodes, the versions published,
the episodes the learner trained as episodes (from the last version's metrics), and the wall time.

    .venv/bin/python bench/agent_served.py [--episodes 512] [--window 128] [--concurrency 4]

Results: bench/results/agent_served.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import ROOT, save  # noqa: E402

MODEL = "liveloop-tiny"


def learner_toml() -> str:
    from liveloop.experiments.agent_config import load_agent_experiment

    values = load_agent_experiment().learner_for("sao") | {"publish_every_steps": 4, "publish_every_seconds": 2.0, "poll_seconds": 0.05}
    return "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())


def episode(client, rater, seed: int) -> tuple[int, bool]:
    """One tool loop: (its rating, whether it called a tool)."""
    from liveloop.clients.tool_env import rate, run_tool, sample

    task = sample(seed)
    messages = task.messages()
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=task.tools, max_tokens=48, seed=seed)
    msg = first.choices[0].message
    final, called = first, bool(msg.tool_calls)
    if msg.tool_calls:
        results = [{"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name, c.function.arguments)} for c in msg.tool_calls]
        final = client.chat.completions.create(model=MODEL, messages=messages + [msg, *results], tools=task.tools, max_tokens=48, seed=seed + 1)
    reward = rate(task, final.choices[0].message.content or "")
    rater.post("/v1/feedback", json={"response_id": final.id, "reward": reward}).raise_for_status()
    return reward, called


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--model", default="models/liveloop-tiny-agent")
    args = parser.parse_args()

    import httpx
    import openai

    from liveloop.devtools import USER_KEY, start_server
    from liveloop.store import Store, StoreConfig

    model_dir = ROOT / args.model
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), model_dir, "hf", learner=learner_toml())
        try:
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=2)
            rater = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60)
            started = time.monotonic()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(lambda i: episode(client, rater, 4_000_000 + i), range(args.episodes)))
            rater.close()
            seconds = time.monotonic() - started
            time.sleep(5)  # the learner's last publish
            store = Store(StoreConfig(url=server.store_url))
            versions = store.versions.list_versions()
            last = max(versions, key=lambda v: v.version)
            linked = store.release.version_traffic()
            store.close()
        finally:
            server.stop()
    rewards = [r for r, _ in results]
    windows = [sum(rewards[i:i + args.window]) / len(rewards[i:i + args.window]) for i in range(0, len(rewards), args.window)]
    calls = [sum(c for _, c in results[i:i + args.window]) / len(results[i:i + args.window]) for i in range(0, len(results), args.window)]
    out = {
        "args": vars(args), "seconds": round(seconds, 1), "episodes_per_second": round(args.episodes / seconds, 2),
        "accuracy_by_window": [round(w, 3) for w in windows], "tool_call_rate_by_window": [round(c, 3) for c in calls],
        "versions_published": last.version, "learner_episodes": last.metrics.get("learner/episodes"),
        "learner_episode_turns": last.metrics.get("learner/episode_turns"),
        "episodes_served_per_version": {v: t.responses for v, t in sorted(linked.items())},
    }
    print(json.dumps(out, indent=1))
    save("agent_served", out, model_dir=model_dir)


if __name__ == "__main__":
    main()
