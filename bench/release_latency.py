"""How long a new version takes to reach users in each release mode, and what it took (the release gate,
server/control/gate.py), on the tiny model: a real `liveloop serve` (hf, SQLite, learner off) per mode; a version
is published into its store as an out-of-process learner publishes one; `--users` simulated users
(the openai client with `user=`) chat back to back and rate every reply thumbs-up through
`/v1/feedback` (live and candidate alike: a candidate as good as the live version).

Per mode and repeat:
- first_user_s: publish -> the first response any user got from the new version;
- everyone_s: publish -> the first response a user outside the canary share got from it (immediate:
  the activation; gated: evaluation + promotion; canary: ratings + evaluation + promotion);
- ratings_at_promotion: the new version's ratings when it was promoted (canary: what `min_ratings` and
  the z-test cost in user exposure), users_exposed_before_promotion: the users who got it before then;
- evaluation_s / evaluation_engine_s: the stored evaluation's wall clock and engine seconds.

    python bench/release_latency.py --modes immediate,gated,canary --repeats 2
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import openai  # noqa: E402

from bench.common import chat_messages, default_model, median, save  # noqa: E402
from liveloop.devtools import ADMIN_KEY, USER_KEY, perturbed_checkpoint, start_server  # noqa: E402
from liveloop.release.routing import in_canary, user_key  # noqa: E402
from liveloop.store import Store, StoreConfig, VersionStatus  # noqa: E402

FRACTION = 0.2


def release_toml(mode: str, min_ratings: int) -> str:
    return f"""
[release]
mode = "{mode}"
canary_fraction = {FRACTION}
min_ratings = {min_ratings}
[release.evaluation]
immediate = true  # immediate mode evaluates each version after it serves (the figure it reports)
max_tokens = 16
[[release.evaluation.bounds]]
check = "kl_to_live"
max_rise = 100.0
"""


def run_mode(mode: str, model_dir: Path, workdir: Path, users: int, min_ratings: int, timeout: float) -> dict:
    server = start_server(workdir, model_dir, "hf", extra=release_toml(mode, min_ratings))
    store = Store(StoreConfig(url=server.store_url))
    names = [f"bench-user-{i}" for i in range(users)]
    canary = {u for u in names if in_canary(user_key(u, ""), FRACTION)}
    stop = threading.Event()
    seen: list[tuple[float, str, int]] = []  # (time, user, version)
    lock = threading.Lock()

    def chat(index: int) -> None:
        oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=2)
        rater = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {USER_KEY}"}, timeout=30)
        i = index
        while not stop.is_set():
            name = names[i % len(names)]
            i += 3
            resp = oai.chat.completions.create(model="liveloop-tiny", messages=chat_messages(i), max_tokens=8, user=name)
            with lock:
                seen.append((time.monotonic(), name, resp.model_extra["policy_version"]))
            rater.post("/v1/feedback", json={"response_id": resp.id, "reward": 1})

    try:
        threads = [threading.Thread(target=chat, args=(k,), daemon=True) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(5)  # the live version's ratings
        ckpt = perturbed_checkpoint(model_dir, workdir / "candidate", seed=1, scale=0.02)
        published = time.monotonic()
        version = store.versions.publish_version(
            parent=0, checkpoint_path=str(ckpt), checkpoint_sha256=None, learner_step=1, samples_used=1,
            metrics={}, cursor_name="sao", last_feedback_id=0,
        ).version
        promoted_at = None
        deadline = published + timeout
        while time.monotonic() < deadline:
            if promoted_at is None and store.versions.get_version(version).status == VersionStatus.SERVING:
                promoted_at = time.monotonic()
                ratings = store.release.version_traffic().get(version)
            with lock:
                outside = [t for t, u, v in seen if v == version and u not in canary]
            if outside and promoted_at is not None:
                break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
        evaluation = None
        for _ in range(120):  # immediate mode evaluates after the version serves
            evaluation = store.release.evaluation(version)
            if evaluation is not None:
                break
            time.sleep(0.5)
        with lock:
            got = [(t, u) for t, u, v in seen if v == version]
        first = min((t for t, _ in got), default=None)
        everyone = min((t for t, u in got if u not in canary), default=None)
        exposed = {u for t, u in got if promoted_at is None or t < promoted_at}
        return {
            "mode": mode,
            "first_user_s": None if first is None else first - published,
            "everyone_s": None if everyone is None else everyone - published,
            "promoted_s": None if promoted_at is None else promoted_at - published,
            "ratings_at_promotion": None if promoted_at is None or ratings is None else ratings.ratings,
            "users_exposed_before_promotion": len(exposed) if promoted_at is not None else None,
            "users": users,
            "evaluation_s": None if evaluation is None else evaluation.seconds,
            "evaluation_engine_s": None if evaluation is None else evaluation.engine_seconds,
            "evaluation_passed": None if evaluation is None else evaluation.passed,
        }
    finally:
        stop.set()
        store.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="immediate,gated,canary")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--min-ratings", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--workdir", default="/tmp/liveloop-bench-release")
    args = parser.parse_args()
    model_dir = default_model()
    rows = []
    for r in range(args.repeats):
        for mode in args.modes.split(","):
            row = run_mode(mode, model_dir, Path(args.workdir) / f"{mode}-{r}", args.users, args.min_ratings, args.timeout)
            rows.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    summary = {}
    for mode in args.modes.split(","):
        mine = [r for r in rows if r["mode"] == mode and r["everyone_s"] is not None]
        if mine:
            summary[mode] = {"everyone_s_median": median([r["everyone_s"] for r in mine]), "runs": len(mine)}
    print(summary)
    save("release_latency", {"rows": rows, "summary": summary, "args": vars(args)}, model_dir)


if __name__ == "__main__":
    main()
