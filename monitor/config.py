"""The drift monitor's configuration section (`[monitor]`)."""

from dataclasses import dataclass, field
from typing import Literal, get_args

from liveloop.config_types import check_literals
from liveloop.monitor.poisoning import Similarity
from liveloop.rewards import RULE_SPECS, make_reward

Detector = Literal["page-hinkley", "cusum"]
DETECTORS: tuple[str, ...] = get_args(Detector)


@dataclass(frozen=True)
class MonitorConfig:
    enabled: bool = field(default=True, metadata={"help": "`liveloop serve` watches the feedback stream for drift"})
    detector: Detector = field(default="page-hinkley", metadata={"help": "change detector: page-hinkley or cusum"})
    delta: float = field(
        default=0.05, metadata={"help": "drift allowance per rating: shifts in reward rate smaller than this are noise"}
    )
    threshold: float = field(default=25.0, metadata={"help": "alarm when the cumulative deviation exceeds this"})
    warmup: int = field(default=50, metadata={"help": "ratings after a (re)start before an alarm can be raised"})
    window_seconds: float = field(default=60.0, metadata={"help": "width of a time bucket in the reward series"})
    segment_key: str = field(default="topic", metadata={"help": "request metadata key that names a user segment"})
    confidence: float = field(default=0.95, metadata={"help": "confidence of the rate intervals"})
    poll_seconds: float = field(default=1.0, metadata={"help": "how often the server reads new ratings"})
    replay_events: int = field(default=20000, metadata={"help": "ratings replayed into the detector at start"})
    max_segments: int = field(
        default=64,
        metadata={"help": "per-segment detectors kept; a new segment past it replaces the one seen least recently"},
    )
    quarantine_z: float = field(
        default=0.0,
        metadata={"help": "auto-quarantine a key whose disagreement score (a z-score) exceeds this (0 = off)"},
    )
    quarantine_min_ratings: int = field(
        default=30, metadata={"help": "ratings with a consensus a key needs before it can be auto-quarantined"}
    )
    quarantine_corroborating_keys: int = field(
        default=11,
        metadata={
            "help": "distinct other keys that must side against a key before it is auto-quarantined: it is scored again "
            "without its N-1 most frequent accusers and must still pass quarantine_z, so N-1 colluders cannot frame an "
            "honest key (1 = no corroboration; a deployment with fewer than N honest raters of the same replies "
            "quarantines no one automatically)"
        },
    )
    similar_reply_jaccard: float = field(
        default=0.8,
        metadata={
            "help": "replies to the same prompt whose token-shingle Jaccard is at least this share one consensus "
            "(1.0 = exact copies only)"
        },
    )
    similar_reply_shingle: int = field(
        default=1, metadata={"help": "tokens per shingle for similar_reply_jaccard (1: token sets; 2: bigrams)"}
    )
    guard: bool = field(default=False, metadata={"help": "roll back a version significantly worse than its parent"})
    guard_min_ratings: int = field(default=100, metadata={"help": "ratings a version needs before the guard judges it"})
    guard_min_keys: int = field(
        default=5, metadata={"help": "distinct unquarantined keys that must have rated a version, and its parent, before the guard judges it (one vote per key)"}
    )
    guard_p_value: float = field(default=0.01, metadata={"help": "one-sided p-value that counts as significantly worse"})
    learner_check_seconds: float = field(
        default=5.0, metadata={"help": "how often the server measures the learner's pace (server/control/learner_watch.py)"}
    )
    learner_short_window_seconds: float = field(
        default=60.0, metadata={"help": "the short window of the learner's pace: arrival and training rates over the last N seconds"}
    )
    learner_long_window_seconds: float = field(
        default=300.0, metadata={"help": "the long window of the learner's pace, the one the behind alarm judges"}
    )
    learner_behind_pace: float = field(
        default=0.8,
        metadata={"help": "a lane falls behind when it trains fewer than this share of the ratings arriving, over the long window"},
    )
    learner_behind_backlog: int = field(
        default=50,
        metadata={"help": "... and at least this many of its ratings wait untrained; it has caught up again at half as many"},
    )
    learner_refused_event_seconds: float = field(
        default=60.0,
        metadata={"help": "at most one learner_step_refused event per lane this often (the refusals between are counted in it)"},
    )
    behaviours: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "trained behaviours whose served rate the dashboard's learning panel shows per segment and version: "
            f"rule specs as the simulated users' rewards take them ({RULE_SPECS})"
        },
    )

    def __post_init__(self) -> None:
        check_literals(self)
        if self.delta < 0 or self.threshold <= 0 or self.warmup < 1:
            raise ValueError("delta must be >= 0, threshold > 0 and warmup >= 1")
        if self.window_seconds <= 0 or self.poll_seconds <= 0:
            raise ValueError("window_seconds and poll_seconds must be > 0")
        if not 0 < self.confidence < 1 or not 0 < self.guard_p_value < 1:
            raise ValueError("confidence and guard_p_value must be in (0, 1)")
        if self.max_segments < 1 or self.quarantine_z < 0 or self.quarantine_min_ratings < 1:
            raise ValueError("max_segments must be >= 1, quarantine_z >= 0 and quarantine_min_ratings >= 1")
        if self.quarantine_corroborating_keys < 1 or not 0 < self.similar_reply_jaccard <= 1 or self.similar_reply_shingle < 1:
            raise ValueError("quarantine_corroborating_keys must be >= 1, similar_reply_jaccard in (0, 1], similar_reply_shingle >= 1")
        if self.guard_min_ratings < 1 or self.guard_min_keys < 1 or self.replay_events < 0:
            raise ValueError("guard_min_ratings and guard_min_keys must be >= 1 and replay_events >= 0")
        if self.learner_check_seconds <= 0 or not 0 < self.learner_short_window_seconds <= self.learner_long_window_seconds:
            raise ValueError("learner_check_seconds must be > 0 and 0 < learner_short_window_seconds <= learner_long_window_seconds")
        if not 0 < self.learner_behind_pace <= 1 or self.learner_behind_backlog < 1 or self.learner_refused_event_seconds < 0:
            raise ValueError("learner_behind_pace must be in (0, 1], learner_behind_backlog >= 1, learner_refused_event_seconds >= 0")
        for spec in self.behaviours:
            try:
                make_reward(spec)
            except ValueError as exc:
                raise ValueError(f"behaviours: {spec!r} is not a rule: {exc}") from None

    @property
    def similarity(self) -> Similarity:
        """When two replies share a consensus in the disagreement score."""
        return Similarity(jaccard=self.similar_reply_jaccard, shingle=self.similar_reply_shingle)
