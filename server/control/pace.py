"""The learner's pace, as a pure function of what the store and the learner say (`measure`): from the
arrival times of a lane's trainable ratings and the looks taken at the lane (when, the last rating id
it had trained, its sample and busy-second counters), over a short and a long window:
- arriving: trainable ratings that arrived in the window, per second of it;
- trained: ratings the lane's cursor moved past, per wall second, measured from the newest look at or
  before the window's start (else the oldest look: then the window is not yet fully measured);
- pace: trained / arriving (1.0 keeps up; None while either is unknown or nothing arrived);
- seconds per rating: busy seconds per sample trained over the same looks;
and the backlog: trainable ratings past the newest look's cursor. The looks must be in time order and
from one run of the lane (server/control/learner_watch.py starts them over when a cursor or counter
goes back: a rollback, a restarted learner)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


class NoLook(ValueError):
    """A pace needs at least one look at the lane."""


@dataclass(frozen=True)
class Look:
    """One look at a lane: when (unix seconds), the last rating id it had trained, and its samples and
    busy seconds (None: the learner did not answer; the cursor is then the store's, published)."""

    at: float
    cursor: int
    samples: int | None = None
    busy_seconds: float | None = None


@dataclass(frozen=True)
class WindowPace:
    seconds: float  # the window
    arriving: float  # trainable ratings that arrived in it, per second
    trained: float | None  # ratings trained per wall second (None: no earlier look to measure from)
    pace: float | None  # trained / arriving (None: either unknown, or nothing arrived)
    seconds_per_rating: float | None  # busy seconds per sample trained (None: nothing trained, or not known)
    measured_seconds: float  # how long the looks the trained rate is measured over span

    @property
    def full(self) -> bool:
        """The trained rate spans the whole window (a sustained figure, not a start's)."""
        return self.measured_seconds >= self.seconds


@dataclass(frozen=True)
class Pace:
    backlog: int  # trainable ratings past the lane's cursor
    backlog_capped: bool  # the store's read was cut: at least `backlog`
    short: WindowPace
    long: WindowPace

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"short": _window_dict(self.short), "long": _window_dict(self.long)}


def _window_dict(w: WindowPace) -> dict[str, Any]:
    return asdict(w) | {"full": w.full}


def _anchor(looks: Sequence[Look], start: float) -> int:
    """The index of the newest look at or before `start`, else 0 (the oldest)."""
    found = 0
    for i, look in enumerate(looks):
        if look.at <= start:
            found = i
    return found


def _seconds_per_rating(looks: Sequence[Look]) -> float | None:
    known = [look for look in looks if look.samples is not None and look.busy_seconds is not None]
    if len(known) < 2:
        return None
    first, last = known[0], known[-1]
    assert first.samples is not None and last.samples is not None and first.busy_seconds is not None and last.busy_seconds is not None
    samples = last.samples - first.samples
    return (last.busy_seconds - first.busy_seconds) / samples if samples > 0 else None


def window_pace(ratings: Sequence[tuple[int, float]], looks: Sequence[Look], now: float, seconds: float) -> WindowPace:
    """One window's figures (see the module's docstring); `ratings` as `measure` takes them."""
    if not looks:
        raise NoLook("a pace needs at least one look at the lane")
    first = _anchor(looks, now - seconds)
    anchor, last = looks[first], looks[-1]
    arrived = sum(1 for _, at in ratings if now - seconds < at <= now)
    arriving = arrived / seconds
    span = last.at - anchor.at
    trained = None
    if span > 0:
        trained = sum(1 for rid, _ in ratings if anchor.cursor < rid <= last.cursor) / span
    pace = trained / arriving if trained is not None and arriving > 0 else None
    return WindowPace(seconds, arriving, trained, pace, _seconds_per_rating(looks[first:]), span)


def measure(
    ratings: Sequence[tuple[int, float]], looks: Sequence[Look], now: float, short: float, long: float, capped: bool = False
) -> Pace:
    """A lane's pace at `now` from `ratings`, (id, arrival unix seconds) of its trainable ratings: every
    one past the oldest look's cursor and every one that arrived in the long window (`capped`: the
    store cut the first kind, so the backlog is a lower bound), and its `looks`, oldest first, the
    newest taken at `now`. Raises NoLook without a look."""
    if not looks:
        raise NoLook("a pace needs at least one look at the lane")
    backlog = sum(1 for rid, _ in ratings if rid > looks[-1].cursor)
    return Pace(backlog, capped, window_pace(ratings, looks, now, short), window_pace(ratings, looks, now, long))
