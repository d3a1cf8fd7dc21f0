"""The learning rig and the served tiny model learn by the same rule (issue 36.4): every `[learner]` and
`[critic]` key the rig's runs read (experiments/uptake.py: tuned_learner + step_control) has the value
`liveloop serve --config tiny` reads (configs/serve/tiny.toml over default.toml), except the keys that say how a server publishes,
batches and caps what it serves (the rig publishes nothing and trains one rating a step), so a rig
result (docs/results/new_objectives.md, levers.md) speaks for the served tiny model
(bench/served_learning.py, docs/results/served_learning.md)."""

from __future__ import annotations

import dataclasses

from liveloop.config import load_config
from liveloop.experiments.uptake import UptakeSpec, config_for

# how a server publishes, batches and caps (the rig: nothing published; one step per rating, 30 users)
SERVING_ONLY = {
    "publish_every_steps", "publish_every_seconds", "coalesce_versions", "poll_seconds", "max_batch_size",
    "checkpoint_dir", "max_per_key_per_window", "lone_key_batches", "keep_last_versions", "keep_parent_chain", "seed",
}


def test_the_rig_and_the_served_default_read_the_same_learner():
    served = load_config("tiny")
    rig = config_for(UptakeSpec("contains:behold", "shared", seed=0))
    differ = {f.name for f in dataclasses.fields(served.learner) if getattr(served.learner, f.name) != getattr(rig.learner, f.name)}
    assert differ <= SERVING_ONLY, f"the rig and the served default learn differently in {sorted(differ - SERVING_ONLY)}"
    assert served.learner.learning_rate == rig.learner.learning_rate and served.learner.target_step_kl > 0
    # the critic likewise, but for what the rig pre-trains it on (the objective)
    pretrain = {"pretrain_reward", "pretrain_rollouts", "pretrain_ev_threshold"}
    critic = {f.name for f in dataclasses.fields(served.critic) if getattr(served.critic, f.name) != getattr(rig.critic, f.name)}
    assert critic <= pretrain, f"the critics differ in {sorted(critic - pretrain)}"


def test_the_served_default_coalesces_versions_and_batches_one_rating_per_key():
    learner = load_config("tiny").learner
    assert learner.coalesce_versions and learner.max_per_key_per_batch == 1 and learner.batch_size == 1
