"""The agent experiment's config: the preset loads every method over the shipped learner settings, and
a bad key or an unknown method is refused by name."""

from __future__ import annotations

import pytest

from liveloop.config import ConfigError
from liveloop.experiments.agent_config import load_agent_experiment, with_overrides


def test_an_unknown_method_is_refused():
    with pytest.raises(ConfigError, match="sao_typo"):
        with_overrides(load_agent_experiment(), methods=("sao", "sao_typo"))


def test_the_preset_runs_every_method_on_its_learner_settings():
    cfg = load_agent_experiment()
    assert cfg.methods == ("sao", "sao_obs_actions", "sao_last_turn", "sliding_window", "grpo")
    assert cfg.learner_for("sao")["kl_estimator"] == "exact"  # configs/fragments/step_control.toml, through extends
    assert cfg.learner_for("sao_obs_actions")["episode_observations"] == "actions"
    assert "episode_observations" not in cfg.learner_for("sao")


def test_a_bad_learner_key_in_a_method_table_is_named(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('extends = "agent_experiment"\n[methods.sao.learner]\nepisode_credit = "middle"\n')
    with pytest.raises(ConfigError, match="methods.sao.learner.episode_credit"):
        load_agent_experiment(path)
