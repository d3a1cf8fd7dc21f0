"""Offline replay: SAO over the ratings already in the store, from a chosen version's weights, through
the same `OnlineLearner` code path (batch retraining). Versions it publishes are "candidate": the
server does not swap them in on its own; an operator promotes one (POST /admin/weights)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.learner.position import LearnerState
from liveloop.store import VersionStatus
from liveloop.store.episodes import EpisodeQueries
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.operator import OperatorQueries
from liveloop.store.versions import VersionQueries


def replay(
    config: LearnerConfig,
    critic: CriticConfig,
    base_model_dir: Path,
    from_version: int | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    *,
    feedback: FeedbackQueries,
    versions: VersionQueries,
    operator: OperatorQueries,
    episodes: EpisodeQueries,
) -> dict[str, Any]:
    version = from_version if from_version is not None else 0
    record = versions.get_version(version)
    if record is None:
        raise ValueError(f"--from-version: no policy version {version}")
    policy_dir = record.checkpoint_path if version > 0 else str(base_model_dir)
    critic_dir = Path(policy_dir).parent / "critic"
    cursor_name = f"replay-v{version}-{int(time.time())}"
    cfg = dataclasses.replace(config, cursor_name=cursor_name)
    state = LearnerState(version=version, cursor=0, pending_cursor=0)
    learner = OnlineLearner(
        cfg, critic, base_model_dir, state, policy_dir, str(critic_dir) if critic_dir.exists() else None,
        feedback=feedback, versions=versions, operator=operator, episodes=episodes, publish_status=VersionStatus.CANDIDATE,
    )
    total = feedback.counts()["feedback"] // cfg.batch_size
    if max_steps is not None:
        total = min(total, max_steps)
    with tqdm(total=total, desc="replay", unit="step", disable=not progress) as bar:
        while state.step < total and learner.step():
            bar.update(1)
            bar.set_postfix(kept=f"{state.last_metrics.get('learner/kept_fraction', 0):.2f}", version=state.version)
    if state.steps_since_publish:
        learner.publish()
    return {"cursor": cursor_name, "steps": state.step, "samples": state.samples, "last_version": state.version}
