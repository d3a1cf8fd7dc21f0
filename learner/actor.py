"""The learner as a Ray actor, co-located with the server on one machine.

`liveloop serve` starts a local Ray (2 CPUs), places this actor on 1 of them and keeps the HTTP server
and the engine outside Ray (plain uvicorn in the driver: on one 2-core machine Ray Serve would add an
HTTP proxy and a replica process, ~1.5 GB and a hop per request, for nothing). Weights travel as
checkpoint directories: the learner publishes a version row, the server's watcher swaps it in.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.store import StoreConfig

log = logging.getLogger(__name__)


class LearnerActor:
    def __init__(self, store: StoreConfig, learner: LearnerConfig, critic: CriticConfig, base_model_dir: str):
        import torch

        from liveloop.learner.online import OnlineLearner
        from liveloop.store import Store

        torch.set_num_threads(1)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s learner: %(message)s")
        self._stop = threading.Event()
        self.store = Store(store)
        self.learner = OnlineLearner.resume(self.store, learner, critic, Path(base_model_dir))

    def run(self, max_steps: int | None = None) -> dict[str, Any]:
        self.learner.run(self._stop.is_set, max_steps)
        return self.status()

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict[str, Any]:
        s = self.learner.state
        busy, idle = self.learner.busy_seconds, self.learner.idle_seconds
        return {
            "version": s.version,
            "cursor": s.cursor,
            "pending_cursor": s.pending_cursor,
            "step": s.step,
            "samples": s.samples,
            "skipped_steps": s.skipped_steps,
            "paused": self.learner.paused,
            "idle_fraction": idle / (busy + idle) if busy + idle else 1.0,
            "busy_seconds": busy,
            "idle_seconds": idle,
            "metrics": s.last_metrics,
        }


class ColocatedLearner:
    """Starts and stops the learner actor in a local Ray, from the server process."""

    def __init__(self, store: StoreConfig, learner: LearnerConfig, critic: CriticConfig, base_model_dir: Path):
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private, loopback-only cluster
        if not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=True)
        actor_cls = ray.remote(num_cpus=1, max_concurrency=4)(LearnerActor)
        self.actor = actor_cls.remote(store, learner, critic, str(base_model_dir))
        # wait until the actor has loaded its models: once the server says healthy, the learner runs
        ray.get(self.actor.status.remote(), timeout=600)
        self.run_ref = self.actor.run.remote()

    def status(self) -> dict[str, Any]:
        import ray

        return ray.get(self.actor.status.remote(), timeout=10)

    def close(self, timeout: float = 120) -> None:
        import ray

        try:
            self.actor.stop.remote()
            ray.get(self.run_ref, timeout=timeout)  # publishes what is pending
        except Exception:
            log.exception("learner actor did not stop cleanly")
        ray.shutdown()
