"""The learner with adapters on: one lane (an `OnlineLearner`) per segment over one frozen base.

    learner = build_learner(store, learner_config, critic_config, base_model_dir)   # either kind
    learner.run(should_stop, max_steps); learner.status()

`SegmentLanes` loads the base once (`AdapterPolicy`) and gives every segment in `segments.lanes` its
own adapter, cursor (`sao:cozy`), pause switch, critic and step-size controllers, all in one process
and one thread: each turn of the loop offers every lane one step, in a fixed order, so a busy segment
cannot starve a quiet one, and a paused or rolled-back segment changes nothing for the others.

The critic of each lane starts from the critic pre-trained for the base (version 0's, when
`liveloop critic pretrain` made one; else a cold one on the base's backbone) and then learns only its
segment's returns, saved with each of its adapter versions. A full critic per segment is cheap for
the tiny model; for large ones the next step is a LoRA critic on a shared trunk (not built yet).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from liveloop.critic.config import CriticConfig
from liveloop.learner.adapters import AdapterPolicy
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.learner.placement import placement
from liveloop.segments import lanes
from liveloop.store import Store
from liveloop.transport import TransportConfig

log = logging.getLogger(__name__)


class SegmentLanes:
    def __init__(self, store: Store, config: LearnerConfig, critic: CriticConfig, base_model_dir: Path):
        self.config = config
        self.adapters = AdapterPolicy(base_model_dir, config.lora, placement(config))
        self.lanes = {
            segment: OnlineLearner.resume(store, config, critic, base_model_dir, segment=segment, adapters=self.adapters)
            for segment in lanes(config)
        }

    def run(self, should_stop: Callable[[], bool], max_steps: int | None = None) -> None:
        """Train every lane until `should_stop()` (or `max_steps` steps in all); each lane publishes what
        is pending before returning, like a single learner."""
        steps = 0
        while not should_stop() and (max_steps is None or steps < max_steps):
            worked = False
            for lane in self.lanes.values():
                if lane.sync_with_store():
                    continue
                if lane.step():
                    worked, steps = True, steps + 1
                if lane.due():
                    lane.publish()
            if not worked:
                started = time.perf_counter()
                time.sleep(self.config.poll_seconds)
                for lane in self.lanes.values():
                    lane.idle_seconds += time.perf_counter() - started
        for lane in self.lanes.values():
            if lane.state.steps_since_publish and not lane.paused:
                lane.publish()
            lane.wait_durable()
            lane.release_memory()

    def publish(self) -> None:
        for lane in self.lanes.values():
            if lane.state.steps_since_publish and not lane.paused:
                lane.publish()

    def status(self) -> dict[str, Any]:
        """Totals across lanes, and each lane's own status under "segments"."""
        per = {segment: lane.status() for segment, lane in self.lanes.items()}
        busy = sum(s["busy_seconds"] for s in per.values())
        idle = max((s["idle_seconds"] for s in per.values()), default=0.0)
        return {
            "adapters": self.config.adapters,
            "step": sum(s["step"] for s in per.values()),
            "samples": sum(s["samples"] for s in per.values()),
            "skipped_steps": sum(s["skipped_steps"] for s in per.values()),
            "paused": all(s["paused"] for s in per.values()),
            "idle_fraction": idle / (busy + idle) if busy + idle else 1.0,
            "busy_seconds": busy,
            "idle_seconds": idle,
            "segments": per,
        }


def build_learner(
    store: Store, config: LearnerConfig, critic: CriticConfig, base_model_dir: Path, transport: TransportConfig | None = None
) -> OnlineLearner | SegmentLanes:
    """The learner `[learner] adapters` asks for: one OnlineLearner on the whole policy (its versions
    travel by `transport`), or a lane per segment (adapters travel as checkpoint directories)."""
    if config.adapters == "none":
        return OnlineLearner.resume(store, config, critic, Path(base_model_dir), transport=transport)
    return SegmentLanes(store, config, critic, Path(base_model_dir))
