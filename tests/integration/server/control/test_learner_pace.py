"""The learner's pace through the real path (server/control/learner_watch.py, run by `Operations`), on
real SQLite and PostgreSQL: ratings stored with arrival times set by the test, the learner's status as
its own typed `LearnerStatus`, time passed in. A learner training a fifth of what arrives records one
`learner_behind` event (not again at the next checks, nor after a restart of the server), and
`learner_caught_up` once it has; a refused step records `learner_step_refused` with its KL and rate,
a second one within the minute only counts (and so do skipped replies, `learner_samples_skipped`); the figures reach /metrics, and per segment with lanes;
without the learner's answer the store's cursor stands in, and a rollback starts the measure over."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import update

from liveloop.learner.status import LaneStatus, LearnerStatus
from liveloop.metrics import Metrics
from liveloop.monitor.config import MonitorConfig
from liveloop.server.control.activator import Activator
from liveloop.server.control.operations import Operations
from liveloop.server.edge.admin import views
from liveloop.store import FeedbackRecord, ResponseRecord, Store
from liveloop.store.models import Feedback

CONFIG = MonitorConfig(
    learner_short_window_seconds=60, learner_long_window_seconds=300, learner_behind_pace=0.8, learner_behind_backlog=50,
    learner_refused_event_seconds=60,
)


def rate(store: Store, t0: float, times: list[float], segment: str | None = None, tag: str = "r") -> None:
    """A rated response per time in `times` (seconds after `t0`), each rating stamped as arriving then."""
    records = [
        ResponseRecord(
            id=f"{tag}-{i}", api_key_id=f"k{i % 7}", model="tiny", policy_version=0, endpoint="chat", prompt_ids=(1, 2),
            response_ids=(3, 4), behavior_logprobs=(-1.0, -1.0), finish_reason="stop", temperature=1.0, top_p=1.0,
            latency_ms=1.0, segment=segment,
        )
        for i in range(len(times))
    ]
    store.feedback.insert_responses(records)
    for i, t in enumerate(times):
        stored = store.feedback.put_feedback(FeedbackRecord(f"{tag}-{i}", f"k{i % 7}", i % 2))
        with store.transaction() as s:  # when it arrived: the test's clock, not the machine's
            s.execute(update(Feedback).where(Feedback.id == stored.id).values(created_at=datetime.fromtimestamp(t0 + t, tz=timezone.utc)))


def lane(cursor: int, rejected: int = 0, segment: str | None = None, step: int | None = None, paused: bool = False,
         skipped: dict[str, int] | None = None) -> LaneStatus:
    """The learner's lane having trained through `cursor` at 8 s a rating, one rating a step (`skipped`:
    the rated replies it could not score, by reason)."""
    counts = {"learner/skipped_samples": float(sum((skipped or {}).values()))} | {
        f"learner/skipped_samples_{reason}": float(n) for reason, n in (skipped or {}).items()}
    return LaneStatus(
        segment=segment, version=0, cursor=0, pending_cursor=cursor, step=cursor if step is None else step, samples=cursor,
        skipped_steps=0, paused=paused, busy_seconds=8.0 * cursor, idle_seconds=0.0,
        metrics={"learner/rejected_steps": float(rejected), "learner/step_kl": 0.3, "learner/lr": 2e-5, "learner/kl_coef": 0.1} | counts,
    )


def operations(store: Store, metrics: Metrics, segments: tuple[str, ...] = ()) -> Operations:
    activator = Activator(None, store.versions, store.operator, Metrics(), "sao", segments)
    return Operations(
        CONFIG, activator, metrics,
        feedback=store.feedback, versions=store.versions, operator=store.operator, release=store.release, keys=store.keys,
        max_step_kl=0.05,
    )


def events(store: Store, kind: str) -> list:
    return [e for e in store.operator.events(limit=1000) if e.kind == kind]


async def test_a_learner_falling_behind_is_alarmed_once_and_cleared(store):
    t0 = float(int(time.time()) - 3600)  # the ratings arrive every 2 s from t0 + 2 to t0 + 300 (ids 1..150)
    rate(store, t0, [2.0 * i for i in range(1, 151)])
    metrics = Metrics()
    ops = operations(store, metrics)
    for t in range(0, 301, 50):  # the learner trains 0.1 a second: cursor t / 10
        paced = await ops.check_pace(lambda: LearnerStatus("none", (lane(t // 10),)), now=t0 + t)
    (one,) = paced.lanes
    assert one.lane == "sao" and one.lineage.is_base and one.answered and one.behind and one.behind_since == t0 + 300
    assert one.pace.backlog == 120 and one.pace.long.pace == pytest.approx(0.2) and one.pace.long.seconds_per_rating == pytest.approx(8.0)
    (behind,) = events(store, "learner_behind")
    assert behind.detail["lane"] == "sao" and behind.detail["backlog"] == 120 and behind.detail["behind_backlog"] == 50
    assert behind.detail["long"]["pace"] == pytest.approx(0.2) and behind.detail["long"]["arriving"] == pytest.approx(0.5)
    assert metrics.render().decode().count('liveloop_learner_behind{segment=""} 1.0') == 1

    # still behind: no second event; nor from a restarted server, which reads the episode back
    await ops.check_pace(lambda: LearnerStatus("none", (lane(35),)), now=t0 + 350)
    restarted = operations(store, Metrics())
    again = await restarted.check_pace(lambda: LearnerStatus("none", (lane(40),)), now=t0 + 400)
    assert again.lanes[0].behind and len(events(store, "learner_behind")) == 1

    # caught up: at most half the threshold waits
    done = await ops.check_pace(lambda: LearnerStatus("none", (lane(140),)), now=t0 + 450)
    assert not done.behind and done.lanes[0].pace.backlog == 10
    (caught_up,) = events(store, "learner_caught_up")
    assert caught_up.detail["since"] == t0 + 300 and caught_up.detail["seconds_behind"] == pytest.approx(150)
    text = metrics.render().decode()
    assert 'liveloop_learner_behind{segment=""} 0.0' in text and 'liveloop_learner_backlog{segment=""} 10.0' in text
    assert 'liveloop_learner_pace{segment="",window="long"}' in text and 'liveloop_learner_ratings_per_second{segment="",window="short"}' in text
    assert 'liveloop_learner_seconds_per_rating{segment="",window="long"} 8.0' in text

    body = views.learner_pace(ops.learner_pace()).model_dump()  # what GET /admin/learner and the dashboard show
    assert body["behind"] is False and body["long_seconds"] == 300 and body["lanes"][0]["backlog"] == 10
    assert body["lanes"][0]["long"]["full"] is True


async def test_refused_steps_are_recorded_with_their_figures_at_most_once_a_minute(store):
    t0 = float(int(time.time()) - 3600)
    rate(store, t0, [1.0, 2.0, 3.0])
    metrics = Metrics()
    ops = operations(store, metrics)
    await ops.check_pace(lambda: LearnerStatus("none", (lane(1, rejected=2),)), now=t0 + 10)  # before the watch: not news
    await ops.check_pace(lambda: LearnerStatus("none", (lane(2, rejected=3),)), now=t0 + 20)
    await ops.check_pace(lambda: LearnerStatus("none", (lane(3, rejected=4),)), now=t0 + 30)  # within the minute
    (refused,) = events(store, "learner_step_refused")
    d = refused.detail
    assert (d["lane"], d["count"], d["total"], d["step"], d["exact"]) == ("sao", 1, 3, 2, True)
    assert (d["step_kl"], d["lr"], d["kl_coef"], d["max_step_kl"]) == (0.3, 2e-5, 0.1, 0.05) and refused.version == 0
    assert 'liveloop_learner_refused_steps_total{segment=""} 2.0' in metrics.render().decode()
    paced = await ops.check_pace(lambda: LearnerStatus("none", (lane(3, rejected=4),)), now=t0 + 80)  # the minute is up
    assert [e.detail["count"] for e in events(store, "learner_step_refused")] == [1, 1] and paced.lanes[0].refused_steps == 2


async def test_replies_the_learner_could_not_score_are_alarmed_with_their_reasons(store):
    """The learner skips a rated reply it cannot score (a grammar its tokens break, ...) and counts it:
    the rise is one `learner_samples_skipped` event with the reasons, at most one a minute, and a
    restarted learner's counter starting over at 0 is no news."""
    t0 = float(int(time.time()) - 3600)
    rate(store, t0, [1.0, 2.0, 3.0, 4.0])
    metrics = Metrics()
    ops = operations(store, metrics)
    await ops.check_pace(lambda: LearnerStatus("none", (lane(1),)), now=t0 + 10)
    await ops.check_pace(lambda: LearnerStatus("none", (lane(2, skipped={"grammar": 2}),)), now=t0 + 20)
    (skipped,) = events(store, "learner_samples_skipped")
    assert (skipped.detail["lane"], skipped.detail["count"], skipped.detail["total"]) == ("sao", 2, 2)
    assert skipped.detail["reasons"] == {"grammar": 2.0} and skipped.version == 0
    assert 'liveloop_learner_samples_skipped_total{segment=""} 2.0' in metrics.render().decode()
    await ops.check_pace(lambda: LearnerStatus("none", (lane(3, step=1),)), now=t0 + 30)  # restarted: 0 again, not news
    await ops.check_pace(lambda: LearnerStatus("none", (lane(4, step=2, skipped={"logprobs": 1}),)), now=t0 + 40)  # within the minute
    assert len(events(store, "learner_samples_skipped")) == 1
    assert 'liveloop_learner_samples_skipped_total{segment=""} 3.0' in metrics.render().decode()
    await ops.check_pace(lambda: LearnerStatus("none", (lane(4, step=2, skipped={"logprobs": 1}),)), now=t0 + 90)
    assert [e.detail["count"] for e in events(store, "learner_samples_skipped")] == [2, 1]


async def test_each_segment_lane_is_paced_on_its_own_ratings(store):
    t0 = float(int(time.time()) - 3600)
    rate(store, t0, [3.0 * i for i in range(1, 101)], segment="cozy", tag="c")  # ids 1..100
    rate(store, t0, [20.0 * i for i in range(1, 6)], segment="overflow", tag="o")  # ids 101..105
    metrics = Metrics()
    ops = operations(store, metrics, segments=("cozy", "overflow"))

    def status(cozy: int, overflow: int):
        return lambda: LearnerStatus("segment", (lane(cozy, segment="cozy"), lane(overflow, segment="overflow", paused=True)))

    await ops.check_pace(status(0, 30), now=t0)
    paced = await ops.check_pace(status(3, 30), now=t0 + 300)
    cozy, overflow = paced.lanes
    assert (cozy.lane, cozy.pace.backlog, overflow.lane, overflow.pace.backlog) == ("sao:cozy", 97, "sao:overflow", 5)
    assert cozy.pace.long.arriving == pytest.approx(1 / 3) and cozy.pace.long.trained == pytest.approx(3 / 300)
    assert cozy.behind and not overflow.behind and overflow.paused  # a paused lane is not judged
    assert [e.detail["lane"] for e in events(store, "learner_behind")] == ["sao:cozy"]
    text = metrics.render().decode()
    assert 'liveloop_learner_backlog{segment="cozy"} 97.0' in text and 'liveloop_learner_backlog{segment="overflow"} 5.0' in text


async def test_without_an_answer_the_stores_cursor_stands_in(store):
    t0 = float(int(time.time()) - 3600)
    rate(store, t0, [1.0, 2.0, 3.0, 4.0])

    def gone() -> LearnerStatus:
        raise RuntimeError("the learner is restarting")

    paced = await operations(store, Metrics()).check_pace(gone, now=t0 + 10)
    (one,) = paced.lanes
    assert not one.answered and one.cursor == store.feedback.get_cursor("sao") == 0 and one.pace.backlog == 4


async def test_a_first_step_refused_counts_and_a_rollback_starts_the_measure_over(store):
    t0 = float(int(time.time()) - 3600)
    rate(store, t0, [float(i) for i in range(1, 21)])
    ops = operations(store, Metrics())
    fresh = dataclasses.replace(lane(0), metrics={})  # a learner that has not stepped yet: nothing refused
    await ops.check_pace(lambda: LearnerStatus("none", (fresh,)), now=t0 + 30)
    await ops.check_pace(lambda: LearnerStatus("none", (lane(10, rejected=1),)), now=t0 + 40)
    assert [e.detail["count"] for e in events(store, "learner_step_refused")] == [1]
    # a rollback moves the cursor back: the trained rate is measured again from there, never negative
    paced = await ops.check_pace(lambda: LearnerStatus("none", (lane(4, rejected=1, step=11),)), now=t0 + 50)
    (one,) = paced.lanes
    assert one.cursor == 4 and one.pace.backlog == 16 and one.pace.long.trained is None
