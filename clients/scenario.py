"""Scenario files for simulated users (`configs/scenarios/drift.toml`): who asks what, who likes which style
when, how fast they arrive, how late and how often they rate.

    scenario = load_scenario("drift")            # a preset name (configs/scenarios/drift.toml) or a path
    phase = preferred_phase(segment.switch_at, count_or_seconds)   # pure: which style is preferred now

A scenario has global settings (`[scenario]`), one feedback-delay distribution
(`[scenario.feedback_delay]`) and user segments (`[[segments]]`). Each segment is recognisable from its
prompts (its own topics), prefers its own style in each phase, and switches phases on its own schedule:
after a number of its own feedback events (`switch_by = "feedback"`) or after a number of seconds since
the start (`switch_by = "seconds"`). The tables are typed sections (`ScenarioSettings`, `Segment`,
`DelayDistribution`) read by liveloop's config loader: a bad file raises `ConfigError` naming the key.

This module only parses and answers questions about the schedule; it does no IO beyond reading the file.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from liveloop.clients.judge import FLATTERY_WORDS, JUDGES
from liveloop.config import ConfigError, check_literals, check_sections, read_toml
from liveloop.model.corpus import STYLES, TOPICS

Style = Literal[STYLES]  # the default corpus' writing styles
Topic = Literal[TOPICS]  # the default corpus' topics


@dataclass(frozen=True)
class DelayDistribution:
    """`[scenario.feedback_delay]`: seconds between reading a reply and sending its thumbs. Heavy-tailed
    by default: `lognormal` (median_seconds, sigma) or `pareto` (median_seconds, alpha: P(X > x) ~
    x^-alpha); `fixed` = always median_seconds. Every draw is capped at max_seconds."""

    distribution: Literal["lognormal", "pareto", "fixed"] = "lognormal"
    median_seconds: float = 0.5
    sigma: float = 1.0
    alpha: float = 1.5
    max_seconds: float = 20.0

    def __post_init__(self) -> None:
        check_literals(self)
        if self.median_seconds < 0:
            raise ValueError("median_seconds must be >= 0")
        if self.sigma <= 0 or self.alpha <= 0:
            raise ValueError("sigma and alpha must be > 0")
        if self.max_seconds < self.median_seconds:
            raise ValueError(f"max_seconds must be >= median_seconds, got {self.max_seconds} < {self.median_seconds}")

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
    """One `[[segments]]` table: a user segment."""

    name: str
    topics: tuple[Topic, ...]
    styles: tuple[Style, ...]  # the preferred style in each phase; len(styles) = len(switch_at) + 1
    switch_at: tuple[float, ...] = ()  # increasing: feedback counts or seconds at which the next phase starts
    switch_by: Literal["feedback", "seconds"] = "feedback"  # this segment's own feedback events | seconds since start
    weight: float = 1.0  # share of arrivals

    def __post_init__(self) -> None:
        check_literals(self)
        if not self.topics or not self.styles:
            raise ValueError("topics and styles must not be empty")
        for j, x in enumerate(self.switch_at):
            if x <= 0:
                raise ValueError(f"switch_at[{j}] must be > 0, got {x!r}")
        if any(a >= b for a, b in zip(self.switch_at, self.switch_at[1:])):
            raise ValueError(f"switch_at must be strictly increasing, got {list(self.switch_at)}")
        if len(self.styles) != len(self.switch_at) + 1:
            raise ValueError(
                f"styles needs one style per phase: {len(self.switch_at)} switch points -> "
                f"{len(self.switch_at) + 1} styles, got {len(self.styles)}"
            )
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")

    def phase(self, feedback_count: int, elapsed_seconds: float) -> int:
        clock = feedback_count if self.switch_by == "feedback" else elapsed_seconds
        return preferred_phase(self.switch_at, clock)

    def style(self, feedback_count: int, elapsed_seconds: float) -> str:
        return self.styles[self.phase(feedback_count, elapsed_seconds)]


@dataclass(frozen=True)
class ScenarioSettings:
    """The `[scenario]` table."""

    name: str = "scenario"
    styles: tuple[Style, ...] = STYLES  # the styles segments may prefer
    seed: int = 0
    max_events: int = 600  # feedback events (ratings sent), then the run stops
    arrival_rate: float = 4.0  # prompts per second (Poisson); each prompt is asked group_size times
    max_in_flight: int = 8  # requests waiting for a reply at once
    # 0: users arrive on their own clock, however far the learner falls behind (a server's reality);
    # N > 0: the next user waits while more than N ratings decided are not yet taken by the
    # learner, so what a run learns depends on its ratings, not on this machine's speed (needs an admin
    # key; see clients/simulator.py)
    max_learner_lag: int = 0
    learner_wait_seconds: float = 120.0  # with max_learner_lag: a learner taking nothing this long fails the run
    rating_probability: float = 0.9  # a user rates a reply with this probability (a GRPO group: all or none)
    group_size: int = 1  # G: the same prompt asked G times (GRPO methods)
    max_tokens: int = 48
    temperature: float = 1.0
    judge: str = "rule"  # rule | flattery | llm:BASE_URL[#MODEL]
    # the flattery judge's lexicon: a reply containing one of these is rated 1, whatever its style
    flattery_words: tuple[str, ...] = FLATTERY_WORDS
    # a population of simulated end users: each arrival is one of `users` ids ("user-0", ...) chosen at
    # random, sent as OpenAI's `user` field (the canary's routing key); 0 = no `user` field
    users: int = 0
    feedback_delay: DelayDistribution = field(default_factory=DelayDistribution)

    def __post_init__(self) -> None:
        check_literals(self)
        if not self.styles:
            raise ValueError("styles must not be empty")
        if self.max_events <= 0 or self.arrival_rate <= 0 or self.max_in_flight <= 0:
            raise ValueError("max_events, arrival_rate and max_in_flight must be > 0")
        if self.max_learner_lag < 0 or self.learner_wait_seconds <= 0:
            raise ValueError("max_learner_lag must be >= 0 and learner_wait_seconds > 0")
        if not 0 < self.rating_probability <= 1:
            raise ValueError(f"rating_probability must be in (0, 1], got {self.rating_probability}")
        if self.group_size < 1 or self.max_tokens < 1:
            raise ValueError("group_size and max_tokens must be >= 1")
        if not (self.judge in ("rule", "flattery") or self.judge.startswith("llm:")):
            raise ValueError(f"judge: expected one of {', '.join(JUDGES)}, got {self.judge!r}")
        if self.judge == "flattery" and not any(self.flattery_words):
            raise ValueError("flattery_words: the flattery judge needs at least one word")
        if self.users < 0:
            raise ValueError(f"users must be >= 0, got {self.users}")


@dataclass(frozen=True, kw_only=True)
class Scenario(ScenarioSettings):
    """A whole scenario: the `[scenario]` settings and the `[[segments]]` beside them."""

    segments: tuple[Segment, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.segments:
            raise ValueError("segments: at least one [[segments]] table is required")
        owner: dict[str, str] = {}
        for i, s in enumerate(self.segments):
            for j, style in enumerate(s.styles):
                if style not in self.styles:
                    raise ValueError(f"segments[{i}].styles[{j}]: {style!r} is not one of scenario.styles {list(self.styles)}")
            for t in s.topics:
                if t in owner:
                    raise ValueError(f"segments[{i}].topics: topic {t!r} already belongs to segment {owner[t]!r}: segments must be recognisable from their prompts")
                owner[t] = s.name
        names = [s.name for s in self.segments]
        if len(set(names)) != len(names):
            raise ValueError(f"segments.name: segment names must be unique, got {names}")

    def with_sizes(self, **changes: Any) -> "Scenario":
        return replace(self, **changes)


def user_ids(users: int) -> list[str]:
    """The simulated users' ids, as sent in OpenAI's `user` field."""
    return [f"user-{k}" for k in range(users)]


def preferred_phase(switch_at: Sequence[float], clock: float) -> int:
    """The phase index at `clock` (a feedback count or seconds): the number of switch points already
    reached. switch_at = [100, 250]: clock 0..99 -> 0, 100..249 -> 1, >= 250 -> 2."""
    return bisect.bisect_right(list(switch_at), clock)


# -- loading ---------------------------------------------------------------------------------------

SECTIONS: dict[str, Any] = {"scenario": ScenarioSettings, "segments": tuple[Segment, ...]}


def scenario_of(settings: ScenarioSettings, segments: tuple[Segment, ...]) -> Scenario:
    """The whole scenario from its typed sections; cross-segment checks are ConfigErrors naming the key."""
    try:
        return Scenario(**{f.name: getattr(settings, f.name) for f in fields(settings)}, segments=segments)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def parse_scenario(data: dict[str, Any]) -> Scenario:
    """A `Scenario` from parsed TOML (`{"scenario": {...}, "segments": [...]}`)."""
    sections = check_sections(SECTIONS, data)
    return scenario_of(sections["scenario"], sections["segments"])


def load_scenario(config: str | Path) -> Scenario:
    """A scenario file: a preset name ("drift" = configs/scenarios/drift.toml) or a path."""
    return parse_scenario(read_toml(config))


def switch_points(scenario: Scenario) -> list[tuple[str, int, float, str, str]]:
    """Every switch as (segment, phase it starts, at, old style, new style)."""
    out = []
    for s in scenario.segments:
        for k, at in enumerate(s.switch_at):
            out.append((s.name, k + 1, at, s.styles[k], s.styles[k + 1]))
    return out
