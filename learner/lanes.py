"""The learner with adapters on: one lane (an `OnlineLearner`) per segment over one frozen base.

    learner = build_learner(learner_config, critic_config, base_model_dir, segments=segments_config, **parts)   # parts as OnlineLearner.resume's
    learner.run(should_stop, max_steps); learner.status()

`SegmentLanes` loads the base once (`AdapterPolicy`) and gives every segment of `[segments]` (`lanes`) its
own adapter, cursor (`sao:cozy`), pause switch, critic and step-size controllers, all in one process
and one thread, run by the loop a plain learner runs by too (learner/loop.py): each turn offers every
lane one step, in a fixed order, so a busy segment cannot starve a quiet one, and a paused or
rolled-back segment changes nothing for the others. Its `status()` is a `LearnerStatus` with one
`LaneStatus` per segment.

The critic of each lane starts from the critic pre-trained for the base (version 0's, when
`liveloop critic pretrain` made one; else a cold one on the base's backbone) and then learns only its
segment's returns, saved with each of its adapter versions. A full critic per segment is cheap for
the tiny model; for large ones the next step is a LoRA critic on a shared trunk (not built yet).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from liveloop.critic.config import CriticConfig
from liveloop.learner.adapters import AdapterPolicy
from liveloop.learner.config import LearnerConfig, check_adapters
from liveloop.learner.loop import run_lanes
from liveloop.learner.online import OnlineLearner
from liveloop.learner.placement import placement
from liveloop.learner.status import LearnerStatus
from liveloop.segments import Lineage, SegmentsConfig, lanes
from liveloop.store.episodes import EpisodeQueries
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.operator import OperatorQueries
from liveloop.store.versions import VersionQueries
from liveloop.transport import TransportConfig

log = logging.getLogger(__name__)


class SegmentLanes:
    def __init__(
        self, config: LearnerConfig, segments: SegmentsConfig, critic: CriticConfig, base_model_dir: Path, *,
        feedback: FeedbackQueries, versions: VersionQueries, operator: OperatorQueries, episodes: EpisodeQueries,
    ):
        check_adapters(config, segments)
        self.config, self.segments = config, segments
        self.adapters = AdapterPolicy(base_model_dir, config.lora, placement(config))
        self.lanes = {
            segment: OnlineLearner.resume(
                config, critic, base_model_dir, feedback=feedback, versions=versions, operator=operator, episodes=episodes,
                lineage=Lineage(segment), adapters=self.adapters,
            )
            for segment in lanes(segments)
        }

    def run(self, should_stop: Callable[[], bool], max_steps: int | None = None) -> None:
        """Train every lane until `should_stop()` (or `max_steps` steps in all); each lane publishes what
        is pending before returning, like a single learner (the same loop: learner/loop.py)."""
        run_lanes(list(self.lanes.values()), should_stop, max_steps, self.config.poll_seconds)

    def publish(self) -> None:
        for lane in self.lanes.values():
            if lane.state.steps_since_publish and not lane.paused:
                lane.publish()

    def status(self) -> LearnerStatus:
        """Every lane's status; the totals across them are `LearnerStatus`'s."""
        return LearnerStatus(self.segments.adapters, tuple(lane.lane_status() for lane in self.lanes.values()))


def build_learner(
    config: LearnerConfig, critic: CriticConfig, base_model_dir: Path, transport: TransportConfig | None = None, *,
    segments: SegmentsConfig,
    feedback: FeedbackQueries, versions: VersionQueries, operator: OperatorQueries, episodes: EpisodeQueries,
) -> OnlineLearner | SegmentLanes:
    """The learner `[segments] adapters` asks for: one OnlineLearner on the whole policy (its versions
    travel by `transport`), or a lane per segment (adapters travel as checkpoint directories)."""
    parts = {"feedback": feedback, "versions": versions, "operator": operator, "episodes": episodes}
    if segments.adapters == "none":
        return OnlineLearner.resume(config, critic, Path(base_model_dir), transport=transport, **parts)
    return SegmentLanes(config, segments, critic, Path(base_model_dir), **parts)
