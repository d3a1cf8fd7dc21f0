"""Pure functions over simulated-user event logs: reward moving averages, time to re-adapt after a
preference switch, the old style's share, reward per phase. No IO, no plotting; inputs are plain
sequences or `clients.simulator.Event`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start): out[i] = mean(values[max(0, i-w+1) : i+1])."""
    if window < 1:
        raise ValueError("window must be >= 1")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def readapt_index(rewards_after_switch: Sequence[float], window: int, threshold: float) -> int | None:
    """How many events after a switch until the reward's moving average is back at or above
    `threshold`: the smallest n >= window such that mean(rewards[n-window : n]) >= threshold, i.e. a full
    window made only of post-switch events. None: never within the data."""
    if window < 1:
        raise ValueError("window must be >= 1")
    total = 0.0
    for n, r in enumerate(rewards_after_switch, start=1):
        total += r
        if n > window:
            total -= rewards_after_switch[n - 1 - window]
        if n >= window and total / window >= threshold:
            return n
    return None


@dataclass(frozen=True)
class Readapt:
    segment: str
    phase: int  # the phase the switch starts
    old_style: str
    new_style: str
    events: int | None  # the segment's feedback events after the switch until re-adapted (None: not within the run)
    seconds: float | None  # wall seconds from the first post-switch event to that event
    events_available: int  # the segment's feedback events after the switch in the run
    old_style_share: float | None  # share of the segment's replies in the old style, last `window` replies of the phase
    new_style_share: float | None
    final_reward: float | None  # reward moving average at the end of the phase


def _field(e: Any, name: str) -> Any:
    return e[name] if isinstance(e, dict) else getattr(e, name)


def segment_events(events: Sequence[Any], segment: str, rated_only: bool = True) -> list[Any]:
    rows = [e for e in events if _field(e, "segment") == segment and (_field(e, "rated") or not rated_only)]
    return sorted(rows, key=lambda e: (_field(e, "t_reply"), _field(e, "index")))


def readapt_after_switches(
    events: Sequence[Any], switches: Sequence[tuple[str, int, Any, str, str]], window: int, threshold: float
) -> list[Readapt]:
    """For each switch (segment, new phase, at, old style, new style): the segment's rated events whose
    judged phase is the new phase, in order; events/seconds until the moving average is back above
    `threshold`; the old and new style's share among the segment's replies (rated or not) at the end of
    that phase."""
    out = []
    for segment, phase, _at, old, new in switches:
        rated = [e for e in segment_events(events, segment) if _field(e, "phase") == phase]
        rewards = [float(_field(e, "reward")) for e in rated]
        n = readapt_index(rewards, window, threshold)
        seconds = _field(rated[n - 1], "t_reply") - _field(rated[0], "t_reply") if n is not None else None
        replies = [e for e in segment_events(events, segment, rated_only=False) if _field(e, "phase") == phase][-window:]
        styles = [_field(e, "reply_style") for e in replies]
        out.append(Readapt(
            segment, phase, old, new, n, seconds, len(rated),
            styles.count(old) / len(styles) if styles else None,
            styles.count(new) / len(styles) if styles else None,
            sum(rewards[-window:]) / len(rewards[-window:]) if rewards else None,
        ))
    return out


def reward_by_phase(events: Sequence[Any], window: int) -> dict[str, float]:
    """Mean reward over the last `window` rated events of each (segment, phase): 'segment/phaseK'."""
    by: dict[tuple[str, int], list[float]] = {}
    for e in sorted((e for e in events if _field(e, "rated")), key=lambda e: _field(e, "t_reply")):
        by.setdefault((_field(e, "segment"), _field(e, "phase")), []).append(float(_field(e, "reward")))
    return {f"{s}/phase{p}": sum(r[-window:]) / len(r[-window:]) for (s, p), r in sorted(by.items())}


def preferred_share_by_phase(events: Sequence[Any], window: int) -> dict[str, float]:
    """Share of replies (rated or not) in the preferred style, last `window` replies of each (segment, phase)."""
    by: dict[tuple[str, int], list[int]] = {}
    for e in sorted(events, key=lambda e: _field(e, "t_reply")):
        by.setdefault((_field(e, "segment"), _field(e, "phase")), []).append(int(_field(e, "reply_style") == _field(e, "preferred")))
    return {f"{s}/phase{p}": sum(v[-window:]) / len(v[-window:]) for (s, p), v in sorted(by.items())}


def group_waits(events: Sequence[Any]) -> list[float]:
    """Client-side GRPO group wait: for each rated group of more than one reply, last minus first
    feedback time."""
    by: dict[str, list[float]] = {}
    for e in events:
        if _field(e, "rated") and _field(e, "t_feedback") is not None:
            by.setdefault(_field(e, "group"), []).append(_field(e, "t_feedback"))
    return [max(ts) - min(ts) for ts in by.values() if len(ts) > 1]
