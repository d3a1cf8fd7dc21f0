"""Where a learner starts: the version its cursor names, that version's weights and critic, and its
counters (`LearnerState`). A version published in memory whose durable checkpoint was never written
(the learner died in between) is recovered here from the transport's memory, or given up.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from liveloop.checkpoint import checkpoint_digest, save_atomically
from liveloop.learner.config import LearnerConfig
from liveloop.segments import BASE, Lineage
from liveloop.transport.weights import load_state
from liveloop.store import VersionRecord
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.versions import VersionQueries
from liveloop.transport import HandleGone, TransportConfig, WeightsUnverified, make_receiver
from liveloop.transport.checkpoint_dir import is_checkpoint

log = logging.getLogger(__name__)


@dataclass
class LearnerState:
    version: int  # the version the learner's weights descend from (last published)
    cursor: int  # last feedback id included in `version`
    pending_cursor: int  # last feedback id trained on since
    step: int = 0
    samples: int = 0
    steps_since_publish: int = 0
    updates_since_publish: int = 0  # steps that changed the weights (not skipped)
    samples_since_publish: int = 0
    skipped_steps: int = 0
    rejected_steps: int = 0  # updates undone because they moved the policy past max_step_kl
    cut_steps: int = 0  # updates past max_step_kl cut back to a fraction that stays within it
    jumps: int = 0  # updates past max_step_kl across a jump in the policy: their smallest cut-back stood
    last_publish: float = field(default_factory=time.monotonic)
    last_metrics: dict[str, float] = field(default_factory=dict)


def critic_dir_for(config: LearnerConfig, version: int) -> Path:
    """Where the critic that belongs to `version` is saved (published versions and pre-training)."""
    return Path(config.checkpoint_dir).resolve() / f"v{version:06d}" / "critic"


def stored_position(
    versions: VersionQueries, feedback: FeedbackQueries, config: LearnerConfig, base_model_dir: Path,
    lineage: Lineage = BASE, transport: TransportConfig | None = None,
) -> tuple[LearnerState, str | None, str | None]:
    """The version this learner's cursor names (or the base model), its weights and critic, read from
    the store's `versions` and `feedback` parts. A lane's weights are its adapter directory, or None (a
    fresh adapter) while it is still at a base version."""
    name, segment = lineage.lane(config.cursor_name), lineage.segment
    version = versions.cursor_version(name)
    record = versions.get_version(version) if version is not None else None
    if record is not None and record.version > 0 and record.segment is None and segment is None and not is_checkpoint(record.checkpoint_path or ""):
        recover_durable(versions, config, base_model_dir, record, name, transport)
        version = versions.cursor_version(name)
        record = versions.get_version(version) if version is not None else None
    cursor = feedback.get_cursor(name)
    if record is None or not record.checkpoint_path or version == 0 or record.segment != segment:
        version = version if record is not None and record.segment is None and segment is not None else 0
        policy_dir = str(base_model_dir) if segment is None else None
    else:
        policy_dir = record.checkpoint_path
    critic = critic_dir_for(config, version)
    critic_dir = str(critic) if critic.exists() else None
    log.info(
        "learner %s at version %d, feedback cursor %d, critic %s",
        name, version, cursor, critic_dir or "cold (not pre-trained)",
    )
    return LearnerState(version=version, cursor=cursor, pending_cursor=cursor), policy_dir, critic_dir


def recover_durable(
    versions: VersionQueries, config: LearnerConfig, base_model_dir: Path, record: VersionRecord, cursor_name: str, transport: TransportConfig | None
) -> None:
    """The learner died after publishing `record` in memory and before its durable checkpoint existed.
    If the transport still holds its tensors, write the checkpoint from them (with the parent's critic);
    else give the version up: the cursor goes back to the parent and its ratings are trained again."""
    root = Path(record.checkpoint_path).parent
    if transport is not None and transport.in_memory:
        receiver = make_receiver(transport)
        try:
            tensors = receiver.tensors(receiver.handle_of(record))  # verified against the row's nonce and digest
        except (HandleGone, WeightsUnverified) as exc:
            log.warning("version %d: its memory cannot be recovered (%s)", record.version, exc)
        else:
            from transformers import AutoModelForCausalLM

            def write(tmp: Path) -> None:
                model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
                load_state(model, tensors)  # every tensor present and finite, or nothing is written
                model.save_pretrained(str(tmp / "policy"))
                parent_critic = critic_dir_for(config, record.parent or 0)
                if parent_critic.exists():
                    shutil.copytree(parent_critic, tmp / "critic")

            save_atomically(root, write)
            versions.set_checkpoint_digest(record.version, checkpoint_digest(root / "policy"))
            log.warning("version %d: durable checkpoint recovered from the transport's memory", record.version)
            return
    parent = versions.get_version(record.parent) if record.parent is not None else None
    parent_cursor = int((parent.metrics or {}).get("learner/cursor", 0)) if parent is not None and parent.version > 0 else 0
    versions.abandon_version(record.version, cursor_name, record.parent or 0, parent_cursor)
    log.error(
        "version %d was lost before its durable checkpoint was written: back to version %d, ratings after %d are trained again",
        record.version, record.parent or 0, parent_cursor,
    )
