"""Load: N simulated users chat (streaming and not; some vanish after the first chunk) and rate the
replies (some change their mind) for a bounded duration against a real `liveloop serve` on the
embedded default shape (vLLM engine, co-located learner publishing every 4 steps, SQLite), so
versions swap under load. Then, with the server stopped, checks that every answer a client received
whole and every rating acknowledged with 200 is in the store. Reports requests/s, latency
percentiles, 5xx (must be 0), 429/503 back-pressure (honoured via Retry-After, not failures), RSS of
every process in the server's tree (Ray workers and the engine core included), ratings trained vs
received and versions published/activated; writes bench/results/load.json.

    .venv/bin/python bench/load.py [--duration 600] [--users 8] [--backend vllm|hf] [--learner on|off]

Exit status 1 when a 5xx, a transport error or a missing/mismatched stored row was seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from common import chat_messages, default_model, percentile, save  # noqa: E402

MODEL = "liveloop-tiny"
BACKPRESSURE = (429, 503)


# -- what the clients saw ------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """A chat answer the client received whole (non-streaming 200, or a stream through [DONE])."""

    response_id: str
    key: str
    finish_reason: str
    policy_version: int
    completion_tokens: int | None  # known for non-streaming answers
    streamed: bool


@dataclass(frozen=True)
class Rating:
    """The last rating the server acknowledged (200) for one feedback row."""

    feedback_id: int
    response_id: str
    reward: int


@dataclass(frozen=True)
class HttpFailure:
    what: str  # "chat", "stream", "feedback", "stream-event"
    status: int
    body: str


@dataclass
class Tally:
    """Everything the simulated users observed; one event loop, so plain mutation is safe."""

    chat_latency: list[float] = field(default_factory=list)
    stream_ttfc: list[float] = field(default_factory=list)
    stream_ttft: list[float] = field(default_factory=list)
    stream_total: list[float] = field(default_factory=list)
    feedback_latency: list[float] = field(default_factory=list)
    attempts: Counter = field(default_factory=Counter)  # chat / stream / feedback requests sent
    backpressure: Counter = field(default_factory=Counter)  # "429 chat", "503 feedback", ...
    retry_after_s: list[float] = field(default_factory=list)  # as the server asked
    retry_after_waited_s: float = 0.0
    server_errors: list[HttpFailure] = field(default_factory=list)
    client_errors: list[HttpFailure] = field(default_factory=list)
    transport_errors: list[str] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)
    vanished: dict[str, str] = field(default_factory=dict)  # response id -> key
    ratings: dict[int, Rating] = field(default_factory=dict)
    rerates: int = 0
    versions_seen: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class Behaviour:
    users: int
    stream_fraction: float
    vanish_fraction: float  # of streams
    rate_probability: float
    rerate_probability: float
    min_tokens: int
    max_tokens: int
    request_timeout: float
    seed: int


def reward_rule(text: str) -> int:
    """A simple, content-dependent thumbs rule (up for the learning benches' target word or a
    reply that ends a sentence)."""
    t = text.strip().lower()
    return int("behold" in t or t.endswith((".", "!", "?")))


def retry_after(r: httpx.Response, default: float = 1.0) -> float:
    try:
        return max(0.0, min(120.0, float(r.headers.get("retry-after", default))))
    except ValueError:
        return default


def stream_error_status(error: object) -> int:
    """The HTTP status an error event inside a stream stands for: 429 for a rate limit, 503 for a
    "please retry" server error (the response could not be logged: back-pressure), else 500."""
    if not isinstance(error, dict):
        return 500
    if error.get("type") == "rate_limit_error":
        return 429
    return 503 if "retry" in str(error.get("message", "")).lower() else 500


class User:
    """One simulated user: chat, maybe rate, maybe change its mind; until the deadline."""

    def __init__(self, u: int, key: str, client: httpx.AsyncClient, b: Behaviour, tally: Tally, deadline: float):
        self.u, self.key, self.client, self.b, self.t, self.deadline = u, key, client, b, tally, deadline
        self.rng = random.Random(b.seed * 1000 + u)
        self.headers = {"Authorization": f"Bearer {key}"}

    async def backoff(self, r: httpx.Response, what: str) -> None:
        self.t.backpressure[f"{r.status_code} {what}"] += 1
        asked = retry_after(r)
        self.t.retry_after_s.append(asked)
        wait = min(asked, max(0.0, self.deadline - time.monotonic()))
        self.t.retry_after_waited_s += wait
        await asyncio.sleep(wait)

    def failed(self, what: str, r: httpx.Response, body: str) -> None:
        failure = HttpFailure(what, r.status_code, body[:2000])
        (self.t.server_errors if r.status_code >= 500 else self.t.client_errors).append(failure)

    async def run(self) -> None:
        i = 0
        while time.monotonic() < self.deadline:
            body = {
                "model": MODEL,
                "messages": chat_messages(self.u + i),
                "max_tokens": self.rng.randint(self.b.min_tokens, self.b.max_tokens),
                "metadata": {"topic": f"u{self.u % 4}"},
            }
            i += 1
            try:
                async with asyncio.timeout(self.b.request_timeout):
                    if self.rng.random() < self.b.stream_fraction:
                        answer = await self.stream(body, vanish=self.rng.random() < self.b.vanish_fraction)
                    else:
                        answer = await self.chat(body)
            except (httpx.HTTPError, TimeoutError) as exc:
                self.t.transport_errors.append(f"chat: {type(exc).__name__}: {exc}"[:300])
                continue
            if answer is None or self.rng.random() >= self.b.rate_probability:
                continue
            text, resp = answer
            reward = reward_rule(text)
            if await self.rate(resp.response_id, reward) and self.rng.random() < self.b.rerate_probability:
                self.t.rerates += await self.rate(resp.response_id, 1 - reward)  # a change of mind

    async def chat(self, body: dict) -> tuple[str, Answer] | None:
        self.t.attempts["chat"] += 1
        start = time.perf_counter()
        r = await self.client.post("/v1/chat/completions", json=body, headers=self.headers)
        if r.status_code in BACKPRESSURE:
            await self.backoff(r, "chat")
            return None
        if r.status_code != 200:
            self.failed("chat", r, r.text)
            return None
        self.t.chat_latency.append(time.perf_counter() - start)
        j = r.json()
        choice = j["choices"][0]
        a = Answer(j["id"], self.key, choice["finish_reason"], j["policy_version"], j["usage"]["completion_tokens"], False)
        self.t.answers[a.response_id] = a
        self.t.versions_seen[a.policy_version] += 1
        return choice["message"]["content"] or "", a

    async def stream(self, body: dict, vanish: bool) -> tuple[str, Answer] | None:
        self.t.attempts["stream"] += 1
        start = time.perf_counter()
        rid, version, finish, text, first_content = None, None, None, "", None
        async with self.client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=self.headers) as r:
            if r.status_code in BACKPRESSURE:
                await r.aread()
                await self.backoff(r, "stream")
                return None
            if r.status_code != 200:
                self.failed("stream", r, (await r.aread()).decode(errors="replace"))
                return None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:  # the stream's own status, after a 200 header
                    status = stream_error_status(event["error"])
                    if status in BACKPRESSURE:
                        self.t.backpressure[f"{status} stream-event"] += 1
                    else:
                        self.t.server_errors.append(HttpFailure("stream-event", status, data[:2000]))
                    return None
                if rid is None:
                    self.t.stream_ttfc.append(time.perf_counter() - start)
                    rid, version = event["id"], event["policy_version"]
                    if vanish:  # close the connection after the first chunk
                        self.t.vanished[rid] = self.key
                        return None
                choice = event["choices"][0] if event.get("choices") else {}
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first_content is None:
                    first_content = time.perf_counter() - start
                text += piece
                finish = choice.get("finish_reason") or finish
            else:
                self.t.transport_errors.append(f"stream {rid}: ended without [DONE]")
                return None
        if rid is None or finish is None:
            self.t.transport_errors.append(f"stream {rid}: [DONE] without a finish_reason")
            return None
        self.t.stream_total.append(time.perf_counter() - start)
        if first_content is not None:
            self.t.stream_ttft.append(first_content)
        a = Answer(rid, self.key, finish, version, None, True)
        self.t.answers[rid] = a
        self.t.versions_seen[version] += 1
        return text, a

    async def rate(self, response_id: str, reward: int) -> bool:
        """POST /v1/feedback, retrying after 429/503 as told, while time remains."""
        while time.monotonic() < self.deadline:
            self.t.attempts["feedback"] += 1
            start = time.perf_counter()
            try:
                async with asyncio.timeout(self.b.request_timeout):
                    r = await self.client.post(
                        "/v1/feedback", json={"response_id": response_id, "reward": reward}, headers=self.headers
                    )
            except (httpx.HTTPError, TimeoutError) as exc:
                self.t.transport_errors.append(f"feedback: {type(exc).__name__}: {exc}"[:300])
                return False
            if r.status_code in BACKPRESSURE:
                await self.backoff(r, "feedback")
                continue
            if r.status_code != 200:
                self.failed("feedback", r, r.text)
                return False
            self.t.feedback_latency.append(time.perf_counter() - start)
            j = r.json()
            self.t.ratings[j["id"]] = Rating(j["id"], j["response_id"], j["reward"])
            return True
        return False


# -- the server's processes ------------------------------------------------------------------------
@dataclass(frozen=True)
class Proc:
    pid: int
    label: str
    rss_mb: float


def process_tree(root_pid: int) -> dict[int, Proc]:
    """RSS of the server process and every descendant (Ray's GCS, raylet and workers, vLLM's engine core)."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            cmd = p.cmdline()
            label = cmd[0] if cmd and "::" in cmd[0] else f"{p.name()}: " + " ".join([Path(cmd[0]).name, *cmd[1:4]] if cmd else [])
            out[p.pid] = Proc(p.pid, label[:100], p.memory_info().rss / 2**20)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def rss_report(start: dict[int, Proc], end: dict[int, Proc], peak_total_mb: float) -> dict:
    rows = []
    for pid in sorted(set(start) | set(end)):
        s, e = start.get(pid), end.get(pid)
        rows.append(
            {
                "pid": pid,
                "process": (e or s).label,
                "start_mb": round(s.rss_mb, 1) if s else None,
                "end_mb": round(e.rss_mb, 1) if e else None,
                "growth_mb": round(e.rss_mb - s.rss_mb, 1) if s and e else None,
            }
        )
    total_s, total_e = sum(p.rss_mb for p in start.values()), sum(p.rss_mb for p in end.values())
    return {
        "processes": rows,
        "total_start_mb": round(total_s, 1),
        "total_end_mb": round(total_e, 1),
        "total_growth_mb": round(total_e - total_s, 1),
        "total_peak_mb": round(peak_total_mb, 1),
    }


@dataclass
class Watch:
    """What the background pollers saw: serving versions over time, peak RSS, health answers."""

    serving: list[tuple[float, int]] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    health_status: Counter = field(default_factory=Counter)


async def watcher(client: httpx.AsyncClient, root_pid: int, w: Watch, deadline: float, t0: float) -> None:
    from liveloop.devtools import ADMIN_KEY

    while time.monotonic() < deadline:
        try:
            r = await client.get("/healthz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)  # details: the operator's
            w.health_status[r.status_code] += 1
            version = r.json().get("policy_version") if r.status_code == 200 else None
            if isinstance(version, int) and (not w.serving or w.serving[-1][1] != version):
                w.serving.append((round(time.monotonic() - t0, 1), version))
        except (httpx.HTTPError, ValueError):
            w.health_status["error"] += 1
        tree = await asyncio.to_thread(process_tree, root_pid)
        w.peak_rss_mb = max(w.peak_rss_mb, sum(p.rss_mb for p in tree.values()))
        await asyncio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


def dir_mb(path: Path) -> float:
    """Bytes under `path` in MiB (files that vanish meanwhile, e.g. pruned checkpoints, count 0)."""
    total = 0
    for f in path.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:
            continue
    return total / 2**20


# -- the embedded default shape --------------------------------------------------------------------
def learner_overrides(overrides: dict[str, str]) -> str:
    """`[learner]` keys (TOML values as text) over the default preset's: the server's config extends
    configs/serve/default.toml by name, so its [learner], [critic] and [monitor] hold (paths, keys and
    `enabled` come from devtools.write_config)."""
    return "\n".join(f"{k.strip()} = {v.strip()}" for k, v in overrides.items())


# -- after the run: the store ----------------------------------------------------------------------
def verify_store(store_url: str, t: Tally, cursor_name: str) -> dict:
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=store_url))
    try:
        missing, mismatched = [], []
        for a in t.answers.values():
            row = store.feedback.get_response(a.response_id)
            if row is None:
                missing.append(a.response_id)
            elif (
                row.finish_reason != a.finish_reason
                or row.policy_version != a.policy_version
                or (a.completion_tokens is not None and len(row.response_ids) != a.completion_tokens)
            ):
                mismatched.append(
                    {"id": a.response_id, "client": [a.finish_reason, a.policy_version, a.completion_tokens],
                     "store": [row.finish_reason, row.policy_version, len(row.response_ids)]}
                )
        vanished_finish: Counter = Counter()
        for rid in t.vanished:
            row = store.feedback.get_response(rid)
            vanished_finish[row.finish_reason if row else "not logged"] += 1
        ratings_missing, ratings_mismatched = [], []
        for rating in t.ratings.values():
            rows = [f for f in store.feedback.get_feedback(rating.response_id) if f.id == rating.feedback_id]
            if not rows:
                ratings_missing.append(rating.feedback_id)
            elif rows[0].reward != rating.reward:
                ratings_mismatched.append({"id": rating.feedback_id, "acked": rating.reward, "stored": rows[0].reward})
        cursor = store.feedback.get_cursor(cursor_name)
        versions = store.versions.list_versions()
        return {
            "answers_acknowledged": len(t.answers),
            "answers_stored": len(t.answers) - len(missing),
            "answers_missing": missing[:50],
            "answers_mismatched": mismatched[:50],
            "ratings_acknowledged": len(t.ratings),
            "ratings_stored": len(t.ratings) - len(ratings_missing),
            "ratings_missing": ratings_missing[:50],
            "ratings_mismatched": ratings_mismatched[:50],
            "vanished_clients": len(t.vanished),
            "vanished_logged": sum(n for k, n in vanished_finish.items() if k != "not logged"),
            "vanished_finish_reasons": dict(vanished_finish),
            "store_counts": store.feedback.counts(),
            "learner_cursor": cursor,
            "ratings_at_or_below_cursor": sum(1 for r in t.ratings if r <= cursor),
            "versions": [{"version": v.version, "status": v.status, "samples_used": v.samples_used} for v in versions],
        }
    finally:
        store.close()


# -- the run ---------------------------------------------------------------------------------------
async def drive(server, args: argparse.Namespace, b: Behaviour) -> dict:
    from liveloop.devtools import ADMIN_KEY, USER_KEY, USER_KEY_2, USER_KEYS

    limits = httpx.Limits(max_connections=4 * args.users + 8)
    timeout = httpx.Timeout(b.request_timeout, connect=10)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=timeout, limits=limits) as client:
        # one warm-up answer per key (not counted): the first request pays for lazy compilation
        for key in (USER_KEY, USER_KEY_2):
            await client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": chat_messages(0), "max_tokens": 8},
                headers={"Authorization": f"Bearer {key}"}, timeout=300,
            )
        rss_start = await asyncio.to_thread(process_tree, server.proc.pid)
        tally, watch = Tally(), Watch(peak_rss_mb=sum(p.rss_mb for p in rss_start.values()))
        t0 = time.monotonic()
        deadline = t0 + args.duration
        keys = [USER_KEYS[u % len(USER_KEYS)] for u in range(args.users)]  # a key per user, as in a chat app's users
        users = [User(u, keys[u], client, b, tally, deadline) for u in range(args.users)]
        await asyncio.gather(watcher(client, server.proc.pid, watch, deadline, t0), *(u.run() for u in users))
        elapsed = time.monotonic() - t0  # includes the requests in flight at the deadline
        rss_end = await asyncio.to_thread(process_tree, server.proc.pid)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        learner = (await client.get("/admin/learner", headers=admin)).json()
        versions = (await client.get("/v1/versions", headers={"Authorization": f"Bearer {USER_KEY}"})).json()
        health = (await client.get("/healthz", headers=admin)).json()
    return {
        "tally": tally, "watch": watch, "elapsed": elapsed, "learner": learner, "versions": versions, "health": health,
        "rss": rss_report(rss_start, rss_end, max(watch.peak_rss_mb, sum(p.rss_mb for p in rss_end.values()))),
    }


def ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 1) if values else None


def summarize(args: argparse.Namespace, out: dict, stored: dict) -> dict:
    t: Tally = out["tally"]
    elapsed = out["elapsed"]
    learner, versions = out["learner"], out["versions"]["data"]
    answered_stream = sum(1 for a in t.answers.values() if a.streamed)
    published = [v for v in versions if v["version"] > 0]
    activated = sorted({v for _, v in out["watch"].serving} | set(t.versions_seen))
    return {
        "config": vars(args),
        "elapsed_s": round(elapsed, 1),
        "throughput": {
            "chat_answers_per_s": round(len(t.answers) / elapsed, 3),
            "chat_requests_per_s": round((t.attempts["chat"] + t.attempts["stream"]) / elapsed, 3),
            "feedback_acks_per_s": round(len(t.feedback_latency) / elapsed, 3),
            "feedback_requests_per_s": round(t.attempts["feedback"] / elapsed, 3),
        },
        "counts": {
            "chat_requests": t.attempts["chat"],
            "stream_requests": t.attempts["stream"],
            "answers_non_streaming": len(t.answers) - answered_stream,
            "answers_streaming": answered_stream,
            "vanished_streams": len(t.vanished),
            "feedback_requests": t.attempts["feedback"],
            "feedback_acknowledged": len(t.feedback_latency),
            "ratings_acknowledged": len(t.ratings),
            "rerates": t.rerates,
        },
        "latency_ms": {
            "chat_p50": ms(t.chat_latency, 50), "chat_p99": ms(t.chat_latency, 99),
            "stream_first_chunk_p50": ms(t.stream_ttfc, 50), "stream_first_chunk_p99": ms(t.stream_ttfc, 99),
            "stream_first_token_p50": ms(t.stream_ttft, 50), "stream_first_token_p99": ms(t.stream_ttft, 99),
            "stream_total_p50": ms(t.stream_total, 50), "stream_total_p99": ms(t.stream_total, 99),
            "feedback_p50": ms(t.feedback_latency, 50), "feedback_p99": ms(t.feedback_latency, 99),
        },
        "errors": {
            "5xx": len(t.server_errors),
            "5xx_bodies": [asdict(f) for f in t.server_errors[:50]],
            "other_4xx": len(t.client_errors),
            "other_4xx_bodies": [asdict(f) for f in t.client_errors[:50]],
            "transport": len(t.transport_errors),
            "transport_detail": t.transport_errors[:50],
        },
        "backpressure": {
            "429": sum(n for k, n in t.backpressure.items() if k.startswith("429")),
            "503": sum(n for k, n in t.backpressure.items() if k.startswith("503")),
            "by_kind": dict(t.backpressure),
            "retry_after_max_s": max(t.retry_after_s, default=None),
            "retry_after_waited_s": round(t.retry_after_waited_s, 1),
        },
        "store": stored,
        "rss": out["rss"],
        "learner": {
            "ratings_received": stored["store_counts"]["feedback"],
            "ratings_past_cursor_at_stop": stored["ratings_at_or_below_cursor"],  # consumed: trained, capped or skipped
            "ratings_trained_samples": learner.get("samples"),  # at the end of the load, before stop
            "status": {k: x for k, x in learner.items() if k != "object"},
        },
        "versions": {
            "published": len(published),
            "published_in_store_after_stop": sum(1 for v in stored["versions"] if v["version"] > 0),
            "activated": len([v for v in activated if v > 0]),
            "served_versions": activated,
            "answers_by_version": {str(k): n for k, n in sorted(t.versions_seen.items())},
            "serving_timeline_s": out["watch"].serving,
            "serving_at_end": out["versions"].get("serving"),
        },
        "healthz": {"polls": dict(out["watch"].health_status), "at_end": out["health"]},
    }


def shown_summary(result: dict) -> dict:
    """The result without its long per-version lists (those stay in the saved file)."""
    v = result["versions"]
    served = v["served_versions"]
    return {
        **result,
        "versions": {
            **{k: x for k, x in v.items() if k not in ("served_versions", "answers_by_version", "serving_timeline_s")},
            "served_versions": f"{len(served)} distinct, {min(served, default=None)}..{max(served, default=None)}",
            "swaps_seen_by_healthz": max(0, len(v["serving_timeline_s"]) - 1),
        },
        "store": {k: x for k, x in result["store"].items() if k != "versions"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load (requests in flight then finish)")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--learner", choices=("on", "off"), default="on")
    parser.add_argument("--stream-fraction", type=float, default=0.5)
    parser.add_argument("--vanish-fraction", type=float, default=0.15, help="of streaming requests")
    parser.add_argument("--rate-probability", type=float, default=0.7)
    parser.add_argument("--rerate-probability", type=float, default=0.15)
    parser.add_argument("--min-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--request-timeout", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--learner-set", action="append", default=[], metavar="KEY=TOML",
        help="override one [learner] key of the default shape, e.g. max_per_key_per_window=0 (repeatable)",
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from liveloop.devtools import start_server
    from liveloop.learner.config import LearnerConfig

    b = Behaviour(
        args.users, args.stream_fraction, args.vanish_fraction, args.rate_probability, args.rerate_probability,
        args.min_tokens, args.max_tokens, args.request_timeout, args.seed,
    )
    learner_toml = learner_overrides(dict(kv.split("=", 1) for kv in args.learner_set))
    model_dir = default_model()
    with tempfile.TemporaryDirectory() as tmp:
        t_start = time.monotonic()
        server = start_server(
            Path(tmp), model_dir, args.backend, timeout=600, learner=learner_toml if args.learner == "on" else None,
            extends="tiny", rate_limits=True,  # the default preset's sections and per-key limits, as served
        )
        startup_s = time.monotonic() - t_start
        try:
            out = asyncio.run(drive(server, args, b))
            workdir_mb = dir_mb(Path(tmp))
        finally:
            server.stop()
        stored = verify_store(server.store_url, out["tally"], LearnerConfig().cursor_name)
    result = summarize(args, out, stored)
    result["server_startup_s"] = round(startup_s, 1)
    result["server_workdir_mb_at_end"] = round(workdir_mb, 1)  # store + published checkpoints
    path = save("load", result)
    print(json.dumps(shown_summary(result), indent=2))
    print(f"saved {path}")
    bad = (
        result["errors"]["5xx"] + result["errors"]["transport"] + len(stored["answers_missing"]) + len(stored["answers_mismatched"])
        + len(stored["ratings_missing"]) + len(stored["ratings_mismatched"])
    )
    if result["errors"]["5xx"]:
        print("5xx responses:", file=sys.stderr)
        for f in out["tally"].server_errors:
            print(f"  {f.what} {f.status}: {f.body}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
