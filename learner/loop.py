"""The learner's one run loop, for one lane (a plain learner) or many (a lane per segment, lanes.py).

    run_lanes(lanes, should_stop, max_steps, poll_seconds)

Each turn offers every lane, in a fixed order, to follow the operator (`sync_with_store`: a paused lane
is skipped, a rolled-back one reloads), one step, and a publish when one is due (`publishing.due`: its
time has come, or the lane held one back for a step that did not come); so a busy segment cannot starve
a quiet one, and a paused or rolled-back lane changes nothing for the others. A turn in which no lane
stepped nor published writes one pending durable checkpoint (learner/publishing.py: never on a thread
beside a step), and a busy lane writes one that waited a publish interval (`write_overdue`); with none pending it sleeps `poll_seconds`, counted as idle time of the lanes that were
running (a paused lane is paused, not idle). `max_steps` bounds the steps of all lanes together
(their `state.step`, which a reload carries on). On the way out each lane publishes what is pending
(unless paused: those ratings are trained again after the next start), waits for its durable
checkpoints and frees the memory its versions held. When a burst of steps ends (the first turn with nothing to do),
the heap its passes freed goes back to the OS (heap.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from liveloop.learner import heap

if TYPE_CHECKING:
    from liveloop.learner.online import OnlineLearner


def run_lanes(
    lanes: Sequence[OnlineLearner], should_stop: Callable[[], bool], max_steps: int | None, poll_seconds: float
) -> None:
    """Train every lane until `should_stop()` (or `max_steps` steps in all), then publish what is pending."""
    trimmed = True
    while not should_stop() and (max_steps is None or sum(lane.state.step for lane in lanes) < max_steps):
        running, acted = [], False
        for lane in lanes:
            if lane.sync_with_store():
                continue
            running.append(lane)
            stepped = lane.step()
            due = lane.publishing.due(stepped)
            if due:
                lane.publish()
            if stepped or due:  # busy: a durable checkpoint that waited a publish interval is written anyway
                lane.publishing.write_overdue()
            acted = acted or stepped or due
        trimmed = trimmed and not acted
        if not acted and any(lane.publishing.write_durable() for lane in lanes):
            continue  # nothing to train: a durable checkpoint was written meanwhile, then look again
        if not acted:
            if not trimmed:  # a burst of steps ended: its freed activations go back to the OS
                heap.trim()
                trimmed = True
            started = time.perf_counter()
            time.sleep(poll_seconds)
            for lane in running:
                lane.idle_seconds += time.perf_counter() - started
    for lane in lanes:
        if lane.state.steps_since_publish and not lane.paused:
            lane.publish()
        lane.publishing.wait_durable()
        lane.publishing.release_memory()
