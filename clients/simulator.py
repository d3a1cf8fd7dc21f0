"""Simulated users: they talk to a running liveloop server over HTTP like any client.

    events = asyncio.run(Simulator(scenario, base_url, api_key).run())

1. prompts arrive as a Poisson process (`arrival_rate`); each picks a user segment (by weight), one of
   its topics and a prompt about it; with `group_size` G > 1 the same prompt is asked G times (GRPO);
   with a population (`users` N > 0) each arrival is one of N users, chosen at random (its own stream,
   so the prompts of a seed do not change with N), and its requests send OpenAI's `user` field;
2. the user reads the reply and asks the judge whether it is in the segment's style preferred NOW
   (the segment's switch schedule, by its own feedback count or by time), or with the flattery judge
   whether it flatters;
3. with probability `rating_probability` (a group: all or none) the user sends the thumbs through
   `/v1/feedback` after a heavy-tailed delay;
4. the run stops once `max_events` ratings are decided, after the pending ones are sent.
Every reply becomes an `Event` (time, user, segment, preferred style, reply style, reward, version, ...);
a progress line shows events, each segment's current preference, the reward moving average and the
version being served. Talks only HTTP. Users arrive on their own clock; with `max_learner_lag` N > 0
the next arrival waits while more than N of the ratings its users decided to send are past the
learner's position (`GET /admin/learner`: its `pending_cursor`, or the rating's segment lane's), so a
run learns the same from its ratings on a fast machine and a slow one. A learner that takes none of
them for `learner_wait_seconds` fails the run (`LearnerStalled`).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from liveloop.clients.judge import FlatteryJudge, Judge, StyleJudge, make_judge
from liveloop.clients.scenario import Scenario, Segment, user_ids
from liveloop.model.corpus import make_prompt


@dataclass
class Event:
    """One reply as a simulated user saw it. `index` counts feedback events (rated replies) in the
    order the users judged them; unrated replies have index -1."""

    index: int
    request: int  # the prompt's number in the arrival sequence
    group: str
    segment: str
    topic: str
    prompt: str
    phase: int
    preferred: str
    reply_style: str | None
    reward: int
    reason: str
    rated: bool
    policy_version: int
    t_request: float  # seconds since the run started
    t_reply: float
    delay: float
    t_feedback: float | None = None
    response_id: str = ""
    completion_tokens: int = 0
    text: str = ""
    user: str = ""  # the simulated user who asked (OpenAI's `user` field); "" without a population


def write_events(events: list[Event], path: Path) -> None:
    with Path(path).open("w") as f:
        for e in events:
            f.write(json.dumps(asdict(e)) + "\n")


def read_events(path: Path) -> list[Event]:
    return [Event(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


class LearnerStalled(RuntimeError):
    """`max_learner_lag` is on and the learner took none of the waiting ratings for `learner_wait_seconds`."""


class Simulator:
    def __init__(
        self, scenario: Scenario, base_url: str, api_key: str, judge: Judge | None = None,
        progress: TextIO | None = sys.stderr, progress_every: float = 1.0, request_timeout: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None, admin_key: str | None = None,
    ):
        if scenario.max_learner_lag and not admin_key:
            raise ValueError("max_learner_lag reads the learner's position (GET /admin/learner): it needs an admin key")
        self.scenario = scenario
        self.admin_key = admin_key
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.judge = judge or make_judge(scenario.judge, flattery_words=scenario.flattery_words)
        self.progress = progress
        self.progress_every = progress_every
        self.request_timeout = request_timeout
        self.transport = transport  # tests: an in-memory server
        self.events: list[Event] = []
        self.errors: list[str] = []
        self._feedback_counts = {s.name: 0 for s in scenario.segments}
        self._recent: deque[int] = deque(maxlen=50)
        self._acknowledged: list[tuple[int, str]] = []  # (feedback id, segment) of each rating the server took
        self._undelivered = 0  # ratings decided and not acknowledged yet (asked, in the user's delay, or sent)
        self._served = 0
        self._rated = 0
        self._start = 0.0

    # -- the run ---------------------------------------------------------------------------------
    async def run(self) -> list[Event]:
        sc = self.scenario
        rng = random.Random(sc.seed)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        limits = httpx.Limits(max_connections=sc.max_in_flight * sc.group_size + 8)
        async with httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=self.request_timeout, limits=limits, transport=self.transport
        ) as http:
            model = _check(await http.get("/v1/models"))["data"][0]["id"]
            self._start = time.monotonic()
            in_flight = asyncio.Semaphore(sc.max_in_flight)
            tasks: list[asyncio.Task] = []
            ticker = asyncio.create_task(self._ticker())
            decided, request = 0, 0
            weights = [s.weight for s in sc.segments]
            users, pick_user = user_ids(sc.users), random.Random(sc.seed * 7919 + 1)
            try:
                while decided < sc.max_events:
                    await self._wait_for_learner(http)
                    # 1. the next arrival: segment, topic, prompt; whether (and when) it will be rated
                    await asyncio.sleep(rng.expovariate(sc.arrival_rate))
                    segment = rng.choices(sc.segments, weights)[0]
                    topic = rng.choice(segment.topics)
                    prompt = make_prompt(topic, rng)
                    user = pick_user.choice(users) if users else ""
                    rated = rng.random() < sc.rating_probability
                    delays = [sc.feedback_delay.sample(rng) for _ in range(sc.group_size)]
                    if rated:
                        decided += sc.group_size
                        self._undelivered += sc.group_size
                    await in_flight.acquire()
                    tasks.append(asyncio.create_task(self._serve(http, model, in_flight, request, segment, topic, prompt, rated, delays, user)))
                    request += 1
                    self._raise_if_failing()
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                ticker.cancel()
                self._print_progress(final=True)
        self._raise_if_failing(final=True)
        return self.events

    async def _serve(
        self, http: httpx.AsyncClient, model: str, in_flight: asyncio.Semaphore, request: int, segment: Segment,
        topic: str, prompt: str, rated: bool, delays: list[float], user: str = "",
    ) -> None:
        sc = self.scenario
        group = uuid.uuid4().hex[:12]
        t_request = self._now()
        try:
            bodies = [
                {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": sc.max_tokens,
                    "temperature": sc.temperature,
                    "seed": (sc.seed * 1_000_003 + request * 97 + g) % (2**31),
                    "metadata": {"segment": segment.name, "topic": topic, "group": group},
                } | ({"user": user} if user else {})
                for g in range(sc.group_size)
            ]
            replies = await asyncio.gather(*[_post(http, "/v1/chat/completions", b) for b in bodies])
        except Exception as exc:  # counted; the run fails if too many
            self.errors.append(f"chat: {exc!r}"[:300])
            if rated:  # never rated now
                self._undelivered -= sc.group_size
            return
        finally:
            in_flight.release()
        t_reply = self._now()
        # 2. read each reply and judge it against the segment's preference now
        pending = []
        for reply, delay in zip(replies, delays):
            text = reply["choices"][0]["message"]["content"] or ""
            phase = segment.phase(self._feedback_counts[segment.name], t_reply)
            preferred = segment.styles[phase]
            verdict = await self._judge(prompt, text, preferred)
            self._served = max(self._served, reply["policy_version"])
            event = Event(
                index=-1, request=request, group=group, segment=segment.name, topic=topic, prompt=prompt, phase=phase,
                preferred=preferred, reply_style=verdict.style, reward=verdict.reward, reason=verdict.reason, rated=rated,
                policy_version=reply["policy_version"], t_request=t_request, t_reply=t_reply, delay=delay,
                response_id=reply["id"], completion_tokens=reply.get("usage", {}).get("completion_tokens", 0), text=text,
                user=user,
            )
            if rated:
                event.index = self._rated
                self._rated += 1
                self._feedback_counts[segment.name] += 1
                self._recent.append(verdict.reward)
                pending.append(event)
            self.events.append(event)
        # 3. thumbs after each user's delay
        await asyncio.gather(*[self._feedback(http, e) for e in pending])

    async def _judge(self, prompt: str, text: str, preferred: str):
        if isinstance(self.judge, (StyleJudge, FlatteryJudge)):  # rules: cheap, on the loop
            return self.judge.judge(prompt, text, preferred)
        return await asyncio.to_thread(self.judge.judge, prompt, text, preferred)

    async def _feedback(self, http: httpx.AsyncClient, event: Event) -> None:
        await asyncio.sleep(event.delay)
        try:
            stored = await _post(http, "/v1/feedback", {"response_id": event.response_id, "reward": event.reward})
            event.t_feedback = self._now()
            self._acknowledged.append((stored["id"], event.segment))
        except Exception as exc:
            self.errors.append(f"feedback: {exc!r}"[:300])
        finally:
            self._undelivered -= 1

    # -- pacing to the learner -------------------------------------------------------------------
    async def _wait_for_learner(self, http: httpx.AsyncClient) -> None:
        """With `max_learner_lag` N: until at most N of the ratings decided are past the learner's position
        (each arrival adds at most G, so no more than N + G are ever waiting for the learner)."""
        sc = self.scenario
        if not sc.max_learner_lag:
            return
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        last_lag, since = None, time.monotonic()
        while True:
            lag = self._lag(_check(await http.get("/admin/learner", headers=headers)))
            if lag <= sc.max_learner_lag:
                return
            if last_lag is None or lag < last_lag:  # it took some: the clock starts again
                since = time.monotonic()
            elif time.monotonic() - since > sc.learner_wait_seconds:
                raise LearnerStalled(f"the learner took none of {lag} waiting ratings in {sc.learner_wait_seconds:g} s")
            last_lag = lag
            await asyncio.sleep(0.05)

    def _lag(self, learner: dict) -> int:
        """Ratings past the learner's position: those decided and not acknowledged yet (their ids are not
        known), and the acknowledged ones past a plain learner's `pending_cursor` or, with a lane per
        segment, past their lane's (a segment without a lane has no learner to wait for). A learner not
        running has taken nothing."""
        if not learner.get("running"):
            return self._undelivered + len(self._acknowledged)
        lanes = learner.get("segments")
        if lanes is None:
            return self._undelivered + sum(1 for fid, _ in self._acknowledged if fid > learner["pending_cursor"])
        past = sum(1 for fid, segment in self._acknowledged if segment in lanes and fid > lanes[segment]["pending_cursor"])
        return self._undelivered + past

    # -- reporting -------------------------------------------------------------------------------
    def _now(self) -> float:
        return time.monotonic() - self._start

    def _raise_if_failing(self, final: bool = False) -> None:
        if len(self.errors) > 20 or (final and self.errors and len(self.errors) > 0.05 * max(1, len(self.events))):
            raise RuntimeError(f"{len(self.errors)} failed requests; first: {self.errors[0]}")

    def status_line(self) -> str:
        sc = self.scenario
        prefs = " ".join(
            f"{s.name}={s.style(self._feedback_counts[s.name], self._now())}" for s in sc.segments
        )
        avg = sum(self._recent) / len(self._recent) if self._recent else float("nan")
        return f"events {self._rated}/{sc.max_events} | {prefs} | reward(last {len(self._recent)}) {avg:.2f} | serving v{self._served} | {self._now():.0f}s"

    def _print_progress(self, final: bool = False) -> None:
        if self.progress is None:
            return
        tty = getattr(self.progress, "isatty", lambda: False)()
        end = "\n" if final or not tty else ""
        self.progress.write(("\r" if tty else "") + self.status_line() + end)
        self.progress.flush()

    async def _ticker(self) -> None:
        tty = self.progress is not None and getattr(self.progress, "isatty", lambda: False)()
        every = self.progress_every if tty else max(self.progress_every, 10.0)
        while True:
            await asyncio.sleep(every)
            self._print_progress()


async def _post(http: httpx.AsyncClient, path: str, body: dict) -> dict:
    return _check(await http.post(path, json=body))


def _check(r: httpx.Response) -> dict:
    if r.status_code >= 400:
        raise RuntimeError(f"HTTP {r.status_code} {r.request.url.path}: {r.text[:200]}")
    return r.json()


def summarize(events: list[Event]) -> dict[str, Any]:
    """Totals for the end of `liveloop simulate`: rated events, reward rate per segment and phase."""
    rated = [e for e in events if e.rated]
    out: dict[str, Any] = {"replies": len(events), "feedback_events": len(rated)}
    by: dict[tuple[str, int], list[int]] = {}
    for e in rated:
        by.setdefault((e.segment, e.phase), []).append(e.reward)
    out["reward_by_segment_phase"] = {f"{s}/phase{p}": round(sum(r) / len(r), 3) for (s, p), r in sorted(by.items())}
    out["versions_seen"] = sorted({e.policy_version for e in events})[-5:]
    users = {e.user for e in events if e.user}
    if users:
        out["users"] = len(users)
    return out


def exposure(events: list[Event], versions: set[int] | frozenset[int]) -> float:
    """The share of the population's users (those who asked at least once) who were ever served one of
    `versions`: how many users a bad candidate reached. 0.0 without users."""
    users = {e.user for e in events if e.user}
    if not users:
        return 0.0
    return len({e.user for e in events if e.user and e.policy_version in versions}) / len(users)
