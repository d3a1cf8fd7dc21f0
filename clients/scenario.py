"""Scenario files for simulated users (`configs/drift.toml`): who asks what, who likes which style
when, how fast they arrive, how late and how often they rate.

    scenario = load_scenario("configs/drift.toml")
    phase = preferred_phase(segment.switch_at, count_or_seconds)   # pure: which style is preferred now

A scenario has global settings (`[scenario]`), one feedback-delay distribution
(`[scenario.feedback_delay]`) and user segments (`[[segments]]`). Each segment is recognisable from its
prompts (its own topics), prefers its own style in each phase, and switches phases on its own schedule:
after a number of its own feedback events (`switch_by = "feedback"`) or after a number of seconds since
the start (`switch_by = "seconds"`). A bad file raises `ScenarioError` naming the field.

This module only parses and answers questions about the schedule; it does no IO beyond reading the file.
"""

from __future__ import annotations

import bisect
import math
import random
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from liveloop.model.corpus import STYLES, TOPICS


class ScenarioError(ValueError):
    """The scenario file is invalid; the message names the field."""


@dataclass(frozen=True)
class DelayDistribution:
    """Seconds between reading a reply and sending its thumbs. Heavy-tailed by default:
    `lognormal` (median_seconds, sigma) or `pareto` (median_seconds, alpha: P(X > x) ~ x^-alpha);
    `fixed` = always median_seconds. Every draw is capped at max_seconds."""

    distribution: str = "lognormal"
    median_seconds: float = 0.5
    sigma: float = 1.0
    alpha: float = 1.5
    max_seconds: float = 20.0

    def sample(self, rng: random.Random) -> float:
        if self.distribution == "fixed":
            x = self.median_seconds
        elif self.distribution == "lognormal":
            x = self.median_seconds * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        else:  # pareto with median m: scale = m / 2^(1/alpha)
            scale = self.median_seconds / 2 ** (1 / self.alpha)
            x = scale * rng.paretovariate(self.alpha)
        return min(max(x, 0.0), self.max_seconds)


@dataclass(frozen=True)
class Segment:
    name: str
    topics: tuple[str, ...]
    styles: tuple[str, ...]  # the preferred style in each phase; len(styles) = len(switch_at) + 1
    switch_at: tuple[float, ...] = ()  # increasing: feedback counts or seconds at which the next phase starts
    switch_by: str = "feedback"  # "feedback" (this segment's own feedback events) | "seconds" (since start)
    weight: float = 1.0  # share of arrivals

    def phase(self, feedback_count: int, elapsed_seconds: float) -> int:
        clock = feedback_count if self.switch_by == "feedback" else elapsed_seconds
        return preferred_phase(self.switch_at, clock)

    def style(self, feedback_count: int, elapsed_seconds: float) -> str:
        return self.styles[self.phase(feedback_count, elapsed_seconds)]


@dataclass(frozen=True)
class Scenario:
    name: str
    segments: tuple[Segment, ...]
    styles: tuple[str, ...] = STYLES
    seed: int = 0
    max_events: int = 600  # feedback events (ratings sent), then the run stops
    arrival_rate: float = 4.0  # prompts per second (Poisson); each prompt is asked group_size times
    max_in_flight: int = 8  # requests waiting for a reply at once
    rating_probability: float = 0.9  # a user rates a reply with this probability (a GRPO group: all or none)
    group_size: int = 1  # G: the same prompt asked G times (GRPO methods)
    max_tokens: int = 48
    temperature: float = 1.0
    judge: str = "rule"  # rule | llm:BASE_URL[#MODEL]
    feedback_delay: DelayDistribution = field(default_factory=DelayDistribution)

    def with_sizes(self, **changes: Any) -> "Scenario":
        return replace(self, **changes)


def preferred_phase(switch_at: Sequence[float], clock: float) -> int:
    """The phase index at `clock` (a feedback count or seconds): the number of switch points already
    reached. switch_at = [100, 250]: clock 0..99 -> 0, 100..249 -> 1, >= 250 -> 2."""
    return bisect.bisect_right(list(switch_at), clock)


# -- parsing ---------------------------------------------------------------------------------------

_SCENARIO_KEYS = {
    "name": str, "seed": int, "max_events": int, "arrival_rate": float, "max_in_flight": int,
    "rating_probability": float, "group_size": int, "max_tokens": int, "temperature": float, "judge": str,
    "styles": list, "feedback_delay": dict,
}
_DELAY_KEYS = {"distribution": str, "median_seconds": float, "sigma": float, "alpha": float, "max_seconds": float}
_SEGMENT_KEYS = {"name": str, "topics": list, "styles": list, "switch_at": list, "switch_by": str, "weight": float}


def _typed(table: dict, schema: dict[str, type], where: str) -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        if key not in schema:
            raise ScenarioError(f"{where}.{key}: unknown key (known: {', '.join(sorted(schema))})")
        want = schema[key]
        if want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif want is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, want)
        if not ok:
            raise ScenarioError(f"{where}.{key}: expected {want.__name__}, got {type(value).__name__} {value!r}")
        out[key] = value
    return out


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ScenarioError(f"{key}: {message}")


def _names(values: list, allowed: Sequence[str], key: str) -> tuple[str, ...]:
    _require(len(values) > 0, key, "must not be empty")
    for i, v in enumerate(values):
        _require(isinstance(v, str) and v in allowed, f"{key}[{i}]", f"unknown value {v!r} (expected one of {', '.join(allowed)})")
    return tuple(values)


def _segment(table: Any, i: int, styles: tuple[str, ...]) -> Segment:
    where = f"segments[{i}]"
    _require(isinstance(table, dict), where, "expected a table")
    data = _typed(table, _SEGMENT_KEYS, where)
    for key in ("name", "topics", "styles"):
        _require(key in data, f"{where}.{key}", "missing")
    topics = _names(data["topics"], TOPICS, f"{where}.topics")
    seg_styles = _names(data["styles"], styles, f"{where}.styles")
    switch_at = data.get("switch_at", [])
    for j, x in enumerate(switch_at):
        _require(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0, f"{where}.switch_at[{j}]", f"expected a positive number, got {x!r}")
    _require(all(a < b for a, b in zip(switch_at, switch_at[1:])), f"{where}.switch_at", "must be strictly increasing")
    _require(
        len(seg_styles) == len(switch_at) + 1, f"{where}.styles",
        f"needs one style per phase: {len(switch_at)} switch points -> {len(switch_at) + 1} styles, got {len(seg_styles)}",
    )
    switch_by = data.get("switch_by", "feedback")
    _require(switch_by in ("feedback", "seconds"), f"{where}.switch_by", f"expected 'feedback' or 'seconds', got {switch_by!r}")
    weight = data.get("weight", 1.0)
    _require(weight > 0, f"{where}.weight", f"must be > 0, got {weight}")
    return Segment(data["name"], topics, seg_styles, tuple(float(x) for x in switch_at), switch_by, weight)


def parse_scenario(data: dict[str, Any]) -> Scenario:
    """A `Scenario` from parsed TOML (`{"scenario": {...}, "segments": [...]}`)."""
    for key in data:
        _require(key in ("scenario", "segments"), key, "unknown section (known: scenario, segments)")
    _require(isinstance(data.get("scenario", {}), dict), "scenario", "expected a table")
    top = _typed(data.get("scenario", {}), _SCENARIO_KEYS, "scenario")
    styles = _names(top.pop("styles"), STYLES, "scenario.styles") if "styles" in top else STYLES
    delay = DelayDistribution(**_typed(top.pop("feedback_delay", {}), _DELAY_KEYS, "scenario.feedback_delay"))
    _require(delay.distribution in ("lognormal", "pareto", "fixed"), "scenario.feedback_delay.distribution",
             f"expected lognormal, pareto or fixed, got {delay.distribution!r}")
    _require(delay.median_seconds >= 0, "scenario.feedback_delay.median_seconds", "must be >= 0")
    _require(delay.sigma > 0 and delay.alpha > 0, "scenario.feedback_delay", "sigma and alpha must be > 0")
    _require(delay.max_seconds >= delay.median_seconds, "scenario.feedback_delay.max_seconds", "must be >= median_seconds")
    segments_raw = data.get("segments")
    _require(isinstance(segments_raw, list) and len(segments_raw) > 0, "segments", "at least one [[segments]] table is required")
    segments = tuple(_segment(t, i, styles) for i, t in enumerate(segments_raw))
    names = [s.name for s in segments]
    _require(len(set(names)) == len(names), "segments.name", f"segment names must be unique, got {names}")
    owner: dict[str, str] = {}
    for i, s in enumerate(segments):
        for t in s.topics:
            _require(t not in owner, f"segments[{i}].topics", f"topic {t!r} already belongs to segment {owner.get(t)!r}: segments must be recognisable from their prompts")
            owner[t] = s.name
    scenario = Scenario(name=top.pop("name", "scenario"), segments=segments, styles=styles, feedback_delay=delay, **top)
    _require(scenario.max_events > 0, "scenario.max_events", "must be > 0")
    _require(scenario.arrival_rate > 0, "scenario.arrival_rate", "must be > 0")
    _require(scenario.max_in_flight > 0, "scenario.max_in_flight", "must be > 0")
    _require(0 < scenario.rating_probability <= 1, "scenario.rating_probability", f"must be in (0, 1], got {scenario.rating_probability}")
    _require(scenario.group_size >= 1, "scenario.group_size", "must be >= 1")
    _require(scenario.max_tokens >= 1, "scenario.max_tokens", "must be >= 1")
    _require(scenario.judge == "rule" or scenario.judge.startswith("llm:"), "scenario.judge", f"expected 'rule' or 'llm:URL', got {scenario.judge!r}")
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from exc
    return parse_scenario(data)


def switch_points(scenario: Scenario) -> list[tuple[str, int, float, str, str]]:
    """Every switch as (segment, phase it starts, at, old style, new style)."""
    out = []
    for s in scenario.segments:
        for k, at in enumerate(s.switch_at):
            out.append((s.name, k + 1, at, s.styles[k], s.styles[k + 1]))
    return out
