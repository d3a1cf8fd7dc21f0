"""The drift experiment on the learning rig, short: every rating recorded with its segment's phase at its
own rating count, the segments as the scenario draws them, and GRPO stepping on whole groups, a group
behind the users."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest

from liveloop.experiments.drift import load_experiment
from liveloop.experiments.drift_rig import arrivals, drift_run, pretrain_critic

RATINGS, SWITCH, SEED = 60, 20, 3


@pytest.fixture(scope="module")
def experiment():
    cfg = load_experiment("drift_long", only=["sao", "grpo"])
    segments = tuple(dataclasses.replace(s, switch_at=(SWITCH,)) for s in cfg.scenario.segments)
    return dataclasses.replace(cfg, pretrain_rollouts=16,
                               scenario=dataclasses.replace(cfg.scenario, max_events=RATINGS, segments=segments))


def check_phases(run, scenario):
    assert [r.index for r in run.ratings] == list(range(RATINGS))
    by_segment = {s.name: [r for r in run.ratings if r.segment == s.name] for s in scenario.segments}
    for s in scenario.segments:
        rows = by_segment[s.name]
        # the segment's own count decides: its first SWITCH ratings are phase 0, the rest phase 1
        assert [r.phase for r in rows] == [int(k >= SWITCH) for k in range(len(rows))]
        assert all(r.preferred == s.styles[r.phase] for r in rows)
        assert all(r.reward in (0, 1) for r in rows)
    readapt = {r.segment: r for r in run.readapt}
    assert {k: r.events_available for k, r in readapt.items()} == {k: max(0, len(v) - SWITCH) for k, v in by_segment.items()}
    assert set(run.reward_by_phase) == {f"{r.segment}/phase{r.phase}" for r in run.ratings}
    return Counter(r.segment for r in run.ratings)


@pytest.mark.learning
def test_sao_and_grpo_on_the_rig(tmp_path, model_dir, experiment):
    sc = experiment.scenario
    critic = pretrain_critic(experiment, model_dir, SEED, tmp_path / "critic")
    drawn = [a.segment.name for a in itertools.islice(arrivals(sc, SEED), RATINGS)]

    methods = {m.name: m for m in experiment.methods}
    sao = drift_run(tmp_path / "sao", model_dir, experiment, methods["sao"], SEED, critic_dir=tmp_path / "critic", critic=critic)
    assert check_phases(sao, sc) == Counter(drawn)  # one reply per arrival, in the simulator's order
    assert [r.segment for r in sao.ratings] == drawn
    assert sao.steps == RATINGS  # batch size 1, one API key per step: a step per rating
    assert sao.critic == critic and all(r.lane is None for r in sao.ratings)

    grpo = drift_run(tmp_path / "grpo", model_dir, experiment, methods["grpo"], SEED)
    G = experiment.group_size
    per_group = [drawn[k] for k in range(RATINGS // G) for _ in range(G)]  # each arrival asked G times
    assert check_phases(grpo, sc) == Counter(per_group)
    groups = Counter(r.group for r in grpo.ratings)
    assert len(groups) == RATINGS // G and set(groups.values()) == {G}
    assert all(len({r.segment for r in grpo.ratings if r.group == g}) == 1 for g in groups)
    # every step took one whole group: as many steps as groups, the learner counted them, the last was G
    assert grpo.steps == RATINGS // G
    assert grpo.final_metrics["policy/learner/groups"] == RATINGS // G
    assert grpo.final_metrics["policy/learner/batch_size"] == G
    assert grpo.final_metrics["policy/learner/groups_pending"] == 0
    # a group behind: group k was sampled after k - 1 steps (the learner had taken groups 0..k-2), so each
    # step after the first trains on a group that the previous step's weights did not sample
    steps_at = {g: {r.steps for r in grpo.ratings if r.group == g} for g in groups}
    assert [steps_at[g] for g in dict.fromkeys(r.group for r in grpo.ratings)] == [{max(0, k - 1)} for k in range(RATINGS // G)]
    assert [r.steps for r in sao.ratings] == [k // 4 * 4 for k in range(RATINGS)]  # SAO: 4 sampled, then 4 steps
