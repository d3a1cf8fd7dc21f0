"""`liveloop experiment agent`: an agent learns to use its tools from binary ratings of its final
answers, each two-turn trajectory one episode (docs/design.md, "Episodes"; results: docs/results/agent.md;
the settings and the methods' learner keys: configs/experiments/agent_experiment.toml).

The task (liveloop/model/tool_corpus.py, clients/tool_env.py): a calculator or a city lookup question,
the two tools offered, to the default build with tool dialogues in its corpus (`AGENT_MODEL`); an
episode is played as the server would serve it (`AgentRun.play`), its final answer rated 0/1.

Through the real store and learner (experiments/rig.py): both turns are written as served responses (the
store links them into one episode), the final one rated by one of 30 simulated keys, and the learner
(the production OnlineLearner, each method's config) catches up after every `batch` episodes. Methods:

| name             | what the learner does with an episode                                              |
|------------------|------------------------------------------------------------------------------------|
| sao              | SAO: every turn's tokens actions, the tool results observations skipped by the GAE |
| sao_obs_actions  | SAO with the observation tokens trained as actions (the ablation SAO argues against) |
| sao_last_turn    | SAO on the rated turn alone (what liveloop did before episodes)                    |
| sliding_window   | A = r - mean(last W rewards) on every action token, no critic                      |
| grpo             | GRPO over groups of G episodes of one task (PPO clip)                              |

Measured per run (`AgentRun.run`): the probe's accuracy curve, ratings-to-effect and the served
accuracy; per method, mean and 95% interval over seeds (experiments/intervals.py)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from liveloop.config import load_section
from liveloop.critic.config import CriticConfig
from liveloop.experiments.agent_config import AgentExperiment
from liveloop.experiments.intervals import mean_ci, median_ci
from liveloop.experiments.rig import USERS, LearningRig, sample_batch
from liveloop.learner.config import LearnerConfig
from liveloop.model.config import ModelBuildConfig

# the default build with tool dialogues in its corpus: it calls a tool on ~70% of first turns, a quarter
# of its calls right, ~18% of its answers right
AGENT_MODEL = ModelBuildConfig(out_dir="models/liveloop-tiny-agent", tool_fraction=0.25, seq_len=256, train_steps=2000)
PROBE_SEED, TASK_SEED = 2_000_000, 3_000_000  # the probe's tasks and each run's, apart from each other

@dataclass(frozen=True)
class Episode:
    task: Any
    final_id: str | None  # the stored final turn (None: not stored, a probe's)
    called: bool
    reward: int


class AgentRun:
    """One method, one seed: the rig, the environment's episodes, their ratings."""

    def __init__(self, cfg: AgentExperiment, method: str, seed: int, workdir: Path, model_dir: Path):
        from transformers import AutoTokenizer

        from liveloop.model.tool_corpus import TOOL_NAMES
        from liveloop.server.edge.pipeline.splicing import Splicer
        from liveloop.server.edge.formats.tool_parsers import PARSERS

        self.cfg, self.method, self.seed = cfg, method, seed
        learner = load_section(LearnerConfig, cfg.learner_for(method) | {"seed": seed, "checkpoint_dir": str(workdir / "versions")},
                               f"methods.{method}.learner")
        self.grouped = learner.method == "grpo"
        critic = load_section(CriticConfig, cfg.critic_for(method), f"methods.{method}.critic")
        self.rig = LearningRig(workdir, model_dir, learner, critic, cfg.max_tokens, seed)
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.parser = PARSERS["hermes"](TOOL_NAMES)
        self.stops = (self.tok.eos_token_id,)
        self.splicer = Splicer(self.tok, self.stops, self.rig.store.episodes.carried_turn)
        self.served = 0

    def close(self) -> None:
        self.rig.close()

    # -- episodes ------------------------------------------------------------------------------------
    def play(self, tasks: list[Any], keys: list[str] | None, generator: torch.Generator, groups: list[str | None] | None = None) -> list[Episode]:
        """Both turns of each task's episode from the live weights; stored (and linked) under `keys`,
        or not at all (None: a probe). The first turn is rendered with the tools by the chat template and
        sampled; its calls read by the server's hermes parser and run by the environment; the call and
        the results rendered back, the second turn's prompt built as the server builds it
        (server/edge/pipeline/splicing.py: the first turn's sampled tokens, then the rest tokenized),
        sampled; the final answer rated 0/1. A first turn without a call is the answer."""
        from liveloop.clients.tool_env import rate, run_tool

        texts = [self._render(t.messages(), t.tools) for t in tasks]
        prompts = [self.tok(text, add_special_tokens=False)["input_ids"] for text in texts]
        with self.rig.serving(None) as (model, _, version):
            first = sample_batch(model, self.tok, prompts, self.cfg.max_tokens, generator)
        ids = self._store(prompts, texts, first, keys, version, groups)
        follow, out = [], [None] * len(tasks)
        for k, (task, roll) in enumerate(zip(tasks, first)):
            parsed = self.parser.parse(roll.text)
            if not parsed.calls:
                out[k] = Episode(task, ids[k], False, rate(task, parsed.content or ""))
                continue
            calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls]
            results = [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": run_tool(c.name, c.arguments)} for c in parsed.calls]
            follow.append((k, self._render(task.messages() + [{"role": "assistant", "content": parsed.content, "tool_calls": calls}, *results], task.tools)))
        if follow:
            key_of = (lambda k: keys[k]) if keys is not None else (lambda k: None)
            if keys is not None:  # as the server builds it: the store finds the first turn, its tokens carried
                prompts2 = [self.splicer.prompt_ids(text, keys[k]) for k, text in follow]
            else:  # a probe stores nothing: the same continuation, from the first turn at hand
                prompts2 = [self.splicer.continued(text, prompts[k], first[k].response_ids) or self.tok(text, add_special_tokens=False)["input_ids"]
                            for k, text in follow]
            with self.rig.serving(None) as (model, _, version):
                second = sample_batch(model, self.tok, prompts2, self.cfg.max_tokens, generator)
            ids2 = self._store(prompts2, [t for _, t in follow], second, [key_of(k) for k, _ in follow] if keys is not None else None,
                               version, [groups[k] for k, _ in follow] if groups else None)
            for (k, _), roll, rid in zip(follow, second, ids2):
                out[k] = Episode(tasks[k], rid, True, rate(tasks[k], self.parser.parse(roll.text).content or ""))
        return out

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)

    def _store(self, prompts, texts, rollouts, keys, version, groups) -> list[str | None]:
        from liveloop.store import ResponseRecord
        from liveloop.store.linking import LinkKeys

        if keys is None:
            return [None] * len(prompts)
        records = []
        for k, (prompt, text, roll) in enumerate(zip(prompts, texts, rollouts)):
            finish = "stop" if roll.response_ids and roll.response_ids[-1] in self.stops else "length"
            records.append(ResponseRecord(
                id=f"agent-{uuid.uuid4().hex}", api_key_id=keys[k], model="agent", policy_version=version, endpoint="chat",
                prompt_ids=tuple(prompt), response_ids=tuple(roll.response_ids), behavior_logprobs=tuple(roll.logprobs),
                finish_reason=finish, temperature=1.0, top_p=1.0, latency_ms=0.0,
                request_meta={"group": groups[k]} if groups and groups[k] else None,
                link=LinkKeys.of(prompt, roll.response_ids, self.stops, self.splicer.text_hash(text, roll.response_ids)),
            ))
        self.rig.store.feedback.insert_responses(records)
        return [r.id for r in records]

    def probe(self) -> float:
        from liveloop.clients.tool_env import sample

        generator = torch.Generator().manual_seed(12345)
        episodes = []
        for start in range(0, self.cfg.probe, 16):
            episodes += self.play([sample(PROBE_SEED + i) for i in range(start, min(start + 16, self.cfg.probe))], None, generator)
        return sum(e.reward for e in episodes) / len(episodes)

    # -- the run -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """One run's measurements: the accuracy of the live weights on `probe` fixed tasks with a fixed
        sampling seed, before training and every `probe_every` rated episodes (paired: the same tasks and
        draws each time); ratings-to-effect: the rated episodes at the first measurement at the base
        accuracy + `effect`; and the accuracy of the last `window` served episodes."""
        from liveloop.clients.tool_env import sample
        from liveloop.store import FeedbackRecord

        cfg, started = self.cfg, time.monotonic()
        base = self.probe()
        curve = [(0, base)]
        generator = torch.Generator().manual_seed(self.seed)
        rewards, calls, task_at, user = [], [], 0, 0
        G = cfg.group_size if self.grouped else 1
        while len(rewards) < cfg.episodes:
            tasks, groups = [], []
            for _ in range(max(1, cfg.batch // G)):
                task = sample(TASK_SEED + self.seed * 100_000 + task_at)
                task_at += 1
                tasks += [task] * G
                groups += [f"task-{task.seed}"] * G
            keys = [f"user-{(user + i) % USERS:02d}" for i in range(len(tasks))]
            user += len(tasks)
            episodes = self.play(tasks, keys, generator, groups)
            for e, key in zip(episodes, keys):
                self.rig.store.feedback.put_feedback(FeedbackRecord(e.final_id, key, e.reward))
                rewards.append(e.reward)
                calls.append(e.called)
            self.rig.train()
            if len(rewards) // cfg.probe_every > curve[-1][0] // cfg.probe_every or len(rewards) >= cfg.episodes:
                curve.append((len(rewards), self.probe()))
        final = curve[-1][1]
        metrics = self.rig.metrics()
        return {
            "method": self.method, "seed": self.seed, "base_accuracy": base, "final_accuracy": final,
            "gain": final - base, "ratings_to_effect": next((n for n, acc in curve[1:] if acc >= base + cfg.effect), None),
            "curve": curve,
            "served_accuracy_last_window": sum(rewards[-cfg.window:]) / len(rewards[-cfg.window:]),
            "called_last_window": sum(calls[-cfg.window:]) / len(calls[-cfg.window:]),
            "episodes": len(rewards), "learner_steps": self.rig.steps,
            "episodes_trained": metrics.get("learner/episodes"), "seconds": round(time.monotonic() - started, 1),
        }


def run_agent(cfg: AgentExperiment, out: Path, model_dir: Path | None = None) -> dict[str, Any]:
    """Every method on every seed; writes runs.json and report.md under `out`, returns the summary."""
    from liveloop.model.build import ensure_model

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir or ensure_model(dataclasses.replace(AGENT_MODEL, out_dir=cfg.model), Path(cfg.model))
    runs = []
    for method in cfg.methods:
        for seed in range(cfg.seeds):
            run = AgentRun(cfg, method, seed, out / f"{method}-s{seed}", Path(model_dir))
            try:
                runs.append(run.run())
            finally:
                run.close()
            print(json.dumps(runs[-1]), flush=True)
            (out / "runs.json").write_text(json.dumps(runs, indent=1))
    summary = summarize(runs, cfg)
    (out / "report.md").write_text(report(summary, cfg))
    return summary


def summarize(runs: list[dict[str, Any]], cfg: AgentExperiment) -> dict[str, Any]:
    out = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        out[method] = {
            "final_accuracy": mean_ci([r["final_accuracy"] for r in mine]),
            "gain": mean_ci([r["gain"] for r in mine]),
            "ratings_to_effect": median_ci([r["ratings_to_effect"] for r in mine]),
            "reached": sum(r["ratings_to_effect"] is not None for r in mine),
            "served_accuracy": mean_ci([r["served_accuracy_last_window"] for r in mine]),
            "runs": len(mine),
        }
    return out


def report(summary: dict[str, Any], cfg: AgentExperiment) -> str:
    lines = [
        f"{cfg.seeds} seeds, {cfg.episodes} rated episodes a run; accuracy on {cfg.probe} fixed tasks (fixed draws) "
        f"every {cfg.probe_every} ratings; ratings to effect: the first measurement at base + {cfg.effect}",
        "",
        "| method | final accuracy | gain over base (paired) | served accuracy, last window | ratings to effect (median) | reached |",
        "|---|---|---|---|---|---|",
    ]
    for method, s in summary.items():
        lines.append(f"| {method} | {s['final_accuracy']} | {s['gain']} | {s['served_accuracy']} | {s['ratings_to_effect']} | {s['reached']}/{s['runs']} |")
    return "\n".join(lines) + "\n"
