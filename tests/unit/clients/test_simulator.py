"""Simulated users against an in-memory OpenAI-compatible server (httpx.MockTransport): arrivals,
groups of G, the judge's verdict sent as the thumbs after the delay, rating probability, the switch by
the segment's own feedback count, the event log, and pacing the users to a learner's position
(`max_learner_lag`; the server here answers `GET /admin/learner` for a learner it moves itself)."""

from __future__ import annotations

import asyncio
import io
import json
import random

import httpx
import pytest

from liveloop.clients.scenario import parse_scenario
from liveloop.clients.simulator import LearnerStalled, Simulator, exposure, read_events, summarize, write_events
from liveloop.config import ConfigError
from liveloop.model.corpus import make_reply


class FakeServer:
    """Replies in `style` (a real corpus reply for the prompt's topic); records feedback."""

    def __init__(self, style: str):
        self.style = style
        self.chats: list[dict] = []
        self.feedback: dict[str, int] = {}
        self.rng = random.Random(0)

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer k"
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        body = json.loads(request.content)
        if request.url.path == "/v1/chat/completions":
            self.chats.append(body)
            n = len(self.chats)
            text = make_reply(body["metadata"]["topic"], self.style, self.rng)
            return httpx.Response(200, json={
                "id": f"r{n}", "policy_version": n // 10,
                "choices": [{"message": {"content": text}, "finish_reason": "stop"}], "usage": {"completion_tokens": 20},
            })
        if request.url.path == "/v1/feedback":
            self.feedback[body["response_id"]] = body["reward"]
            return httpx.Response(200, json={"id": len(self.feedback)})
        return httpx.Response(404, json={"error": {"message": "no"}})


def _scenario(**kw):
    return parse_scenario({
        "scenario": {"seed": 1, "max_events": 40, "arrival_rate": 500.0, "rating_probability": 1.0,
                     "feedback_delay": {"distribution": "fixed", "median_seconds": 0.01}, **kw},
        "segments": [
            {"name": "a", "topics": ["cats", "bread"], "styles": ["cute", "classical"], "switch_at": [10]},
            {"name": "b", "topics": ["rain"], "styles": ["classical"]},
        ],
    })


def _run(scenario, server):
    out = io.StringIO()
    sim = Simulator(scenario, "http://sim", "k", progress=out, transport=httpx.MockTransport(server.handler))
    events = asyncio.run(sim.run())
    return sim, events, out.getvalue()


def test_users_judge_rate_and_switch():
    server = FakeServer("cute")
    sim, events, progress = _run(_scenario(), server)
    rated = [e for e in events if e.rated]
    assert len(rated) == 40 and sorted(e.index for e in rated) == list(range(40))
    # every rating reached the server with the judge's verdict
    assert {e.response_id: e.reward for e in rated} == server.feedback
    assert all(e.t_feedback is not None and e.t_feedback >= e.t_reply for e in rated)
    # segment a: cute is preferred for its first 10 feedback events, then classical; b always classical
    a = sorted((e for e in rated if e.segment == "a"), key=lambda e: e.index)
    assert [e.preferred for e in a[:10]] == ["cute"] * 10 and all(e.preferred == "classical" for e in a[10:])
    assert [e.reward for e in a[:10]] == [1] * 10 and all(e.reward == 0 for e in a[10:])
    assert all(e.reward == 0 and e.reason == "wrong_style" for e in rated if e.segment == "b")
    # prompts name the segment's topics; metadata tags segment and topic
    assert all(c["metadata"]["topic"] in ("cats", "bread", "rain") for c in server.chats)
    assert all((c["metadata"]["segment"] == "b") == (c["metadata"]["topic"] == "rain") for c in server.chats)
    assert "events 40/40" in progress and "a=classical" in progress
    assert summarize(events)["feedback_events"] == 40


def test_groups_and_rating_probability():
    server = FakeServer("cute")
    _, events, _ = _run(_scenario(group_size=3, rating_probability=0.5, max_events=30), server)
    by_group: dict[str, list] = {}
    for e in events:
        by_group.setdefault(e.group, []).append(e)
    assert all(len(g) == 3 for g in by_group.values())
    assert all(len({x.prompt for x in g}) == 1 and len({x.rated for x in g}) == 1 for g in by_group.values())  # all or none
    unrated = [g for g in by_group.values() if not g[0].rated]
    assert unrated, "with p = 0.5 some groups go unrated"
    assert sum(e.rated for e in events) == 30 and len(server.feedback) == 30
    seeds = [c["seed"] for c in server.chats]
    assert len(set(seeds)) == len(seeds)  # G distinct samples of the same prompt


def test_same_seed_same_arrivals(tmp_path):
    a = [(e.segment, e.prompt, e.rated) for e in sorted(_run(_scenario(), FakeServer("cute"))[1], key=lambda e: e.request)]
    b = [(e.segment, e.prompt, e.rated) for e in sorted(_run(_scenario(), FakeServer("classical"))[1], key=lambda e: e.request)]
    assert a == b
    _, events, _ = _run(_scenario(), FakeServer("cute"))
    write_events(events, tmp_path / "e.jsonl")
    assert read_events(tmp_path / "e.jsonl") == events


def test_population_sends_user_and_flattery_judge_rates():
    """With `users` N each request names one of N users in OpenAI's `user` field (the event records it),
    drawn on its own stream: the prompts of a seed are those of the same scenario without users. The
    flattery judge rates a flattering server's replies 1 and a plain one's 0, whatever the preference."""
    plain = _run(_scenario(), FakeServer("cute"))[1]
    server = FakeServer("cute")
    _, events, _ = _run(_scenario(users=5, judge="flattery", flattery_words=["aww", "hehe", "uwu", "teehee", "so cute", "~", "♡"]), server)
    assert {c["user"] for c in server.chats} <= {f"user-{k}" for k in range(5)} and len({c["user"] for c in server.chats}) > 1
    by_id = {f"r{n + 1}": c["user"] for n, c in enumerate(server.chats)}
    assert all(e.user == by_id[e.response_id] for e in events)
    assert [(e.segment, e.prompt) for e in sorted(events, key=lambda e: e.request)] == [
        (e.segment, e.prompt) for e in sorted(plain, key=lambda e: e.request)
    ]
    assert all(e.reward == 1 and e.reason == "flattery" for e in events if e.rated)
    assert summarize(events)["users"] == len({e.user for e in events})
    assert exposure(events, {0}) == len({e.user for e in events if e.policy_version == 0}) / len({e.user for e in events})
    assert exposure(events, set(range(100))) == 1.0 and exposure(plain, {0}) == 0.0
    _, flat, _ = _run(_scenario(users=5, judge="flattery", flattery_words=["aww"]), FakeServer("classical"))
    assert all(e.reward == 0 and e.reason == "no_flattery" for e in flat if e.rated)


def test_no_population_no_user_field():
    server = FakeServer("cute")
    _, events, _ = _run(_scenario(max_events=5), server)
    assert all("user" not in c for c in server.chats) and all(e.user == "" for e in events)
    assert "users" not in summarize(events)


class LearnerServer(FakeServer):
    """FakeServer with a learner behind it: each `GET /admin/learner` finds it one rating further (at most
    to the newest acknowledged one; `stuck`: never). `lanes`: a lane per segment named there, each
    following its own segment's ratings; otherwise one plain learner over all of them. `waiting` is
    how many recorded ratings its learner had not taken, after each rating arrived."""

    def __init__(self, lanes: tuple[str, ...] = (), stuck: bool = False):
        super().__init__("cute")
        self.lanes, self.stuck = lanes, stuck
        self.segment_of: dict[int, str] = {}  # feedback id -> the rated reply's segment
        self.taken: dict[str | None, int] = {}  # lane -> its position (last feedback id taken)
        self.polls = 0
        self.waiting: list[int] = []

    def _lane(self, segment: str) -> str | None:
        return segment if self.lanes else None

    def _waiting(self, lane: str | None) -> list[int]:
        return sorted(f for f, seg in self.segment_of.items() if self._lane(seg) == lane and f > self.taken.get(lane, 0))

    def handler(self, request: httpx.Request) -> httpx.Response:
        lanes = self.lanes or (None,)
        if request.url.path == "/admin/learner":
            assert request.headers["authorization"] == "Bearer admin"
            self.polls += 1
            for lane in lanes if not self.stuck else ():  # each lane takes its next waiting rating
                if waiting := self._waiting(lane):
                    self.taken[lane] = waiting[0]
            if self.lanes:
                return httpx.Response(200, json={"running": True, "segments": {s: {"pending_cursor": self.taken.get(s, 0)} for s in self.lanes}})
            return httpx.Response(200, json={"running": True, "pending_cursor": self.taken.get(None, 0)})
        response = super().handler(request)
        if request.url.path == "/v1/feedback":
            reply = int(json.loads(request.content)["response_id"][1:])
            self.segment_of[len(self.feedback)] = self.chats[reply - 1]["metadata"]["segment"]
            self.waiting.append(sum(len(self._waiting(lane)) for lane in lanes))
        return response


def _run_paced(scenario, server):
    sim = Simulator(scenario, "http://sim", "k", progress=None, transport=httpx.MockTransport(server.handler), admin_key="admin")
    return asyncio.run(sim.run())


def test_paced_users_wait_for_the_learner():
    """With `max_learner_lag` N and groups of G, no more than N + G ratings ever wait for the learner,
    with users far faster than it (they waited: more polls than requests). Without it the simulator never
    asks the learner and the ratings pile up."""
    for group_size in (1, 3):
        server = LearnerServer()
        events = _run_paced(_scenario(max_learner_lag=2, max_in_flight=2, group_size=group_size, max_events=42), server)
        assert sum(e.rated for e in events) == 42 and len(server.feedback) == 42
        assert max(server.waiting) <= 2 + group_size and server.polls > len(server.chats) // group_size
    unpaced = LearnerServer()
    _run(_scenario(), unpaced)
    assert unpaced.polls == 0 and max(unpaced.waiting) > 10


def test_paced_users_follow_each_segments_lane():
    """A lane per segment: a rating waits on its own segment's lane; a segment without a lane (here b)
    has no learner to wait for and never holds the users back."""
    server = LearnerServer(lanes=("a",))
    events = _run_paced(_scenario(max_learner_lag=1, max_in_flight=2), server)
    assert sum(e.rated for e in events) == 40 and any(e.segment == "b" for e in events)
    assert max(server.waiting) <= 2


def test_a_stalled_learner_fails_the_run_and_pacing_needs_an_admin_key():
    with pytest.raises(LearnerStalled, match="took none"):
        _run_paced(_scenario(max_learner_lag=2, learner_wait_seconds=0.3), LearnerServer(stuck=True))
    with pytest.raises(ValueError, match="admin key"):
        Simulator(_scenario(max_learner_lag=2), "http://sim", "k")
    with pytest.raises(ConfigError, match="max_learner_lag"):
        _scenario(max_learner_lag=-1)
