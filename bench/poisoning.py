"""Poisoned feedback: how far one API key that inverts the other users' taste moves the policy, with
and without the defences (influence caps, learner/influence.py; quarantine by disagreement score,
monitor/poisoning.py).

    python bench/poisoning.py [--honest-keys 128] [--ratings-per-key 6] [--seeds 0 1 2 3 4]
                              [--learner default|bare] [--model DIR]

The world (in-process, a real SQLite store, the real `OnlineLearner` running the sliding-window method
with the shipped learning rule of configs/serve/default.toml, or `--learner bare`, on the tiny model):
- fixed chat prompts; every reply is ONE token sampled from the learner's current policy (so replies
  repeat and the disagreement score has groups to compare);
- honest users, each with its own key, rate up exactly when the reply is the target token ("Behold");
  they rate in rounds (every key once a round), `ratings_per_key` rounds;
- one attacker key rates its own replies inverted: 5% of all ratings in the first half of the rounds,
  then 50% in the second half.
Three runs share every random draw of the honest users (common random numbers):
  no attack (defended config: it must cap and quarantine nothing, so it is also the undefended
  baseline), attack undefended (no window cap, no quarantine), attack defended (caps + quarantine).
The behaviour measured is the policy's exact probability of the target token as the reply to the
prompts (mean over prompts); honest users' expected reward is that probability (in points, x100).
Where a run ends up is the probability's mean over its last quarter of policy steps (`p_end`); movement
caused by the attack = the attacked run's `p_end` minus the no-attack run's.

Writes bench/results/poisoning_<learner>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TARGET = "Behold"
PROMPTS = ["Tell me about cats.", "Tell me about the sea.", "Tell me about rain.", "Tell me about bread."]
ATTACKER = "attacker"


@dataclass(frozen=True)
class Scenario:
    attack: bool
    defended: bool
    honest_keys: int = 64
    ratings_per_key: int = 6  # honest ratings per key (rounds)
    early_share: float = 0.05  # the attacker's share of all ratings in the first half
    late_share: float = 0.5  # ... and in the second half
    cap_per_window: int = 0  # [learner] max_per_key_per_window when defended; 0: ratings_per_key (honest keys never hit it)
    quarantine_z: float = 3.0
    quarantine_min_ratings: int = 30
    check_every: int = 8  # ratings between two quarantine checks (the server's loop)
    # the learning rule: "default" is the shipped one (configs/serve/tiny.toml's [learner]: step-size control,
    # trust region, exact KL anchor); "bare" is the LearnerConfig dataclass alone (a fixed learning rate,
    # no anchor), which overshoots on one-token replies (docs/design.md, "Reproducible verdicts")
    learner: str = "default"
    learning_rate: float | None = None  # None: the learning rule's own
    batch_size: int = 8  # B, with at most one sample of a key per step ([learner] max_per_key_per_batch = 1)
    method: str = "sliding_window"
    window: int = 32
    seed: int = 0


@dataclass
class RunResult:
    scenario: Scenario
    p_before: float
    p_after: float  # after the last step
    honest_ratings: int
    attacker_ratings: int
    trained: int
    capped: int
    quarantined: list[str] = field(default_factory=list)
    p_trace: list[float] = field(default_factory=list)  # the target's probability after every policy step
    quarantined_after_ratings: int | None = None  # ratings stored when the attacker was quarantined
    attacker_z: float | None = None
    max_honest_z: float | None = None
    seconds: float = 0.0

    @property
    def p_end(self) -> float:
        """The target's probability over the run's last quarter of steps (mean): where the run ended up,
        without the step-to-step swing of one point (0.65-0.90 between neighbouring steps, measured)."""
        tail = self.p_trace[-max(1, len(self.p_trace) // 4):] or [self.p_after]
        return sum(tail) / len(tail)

    @property
    def honest_reward_points(self) -> float:
        return 100.0 * self.p_end

    def as_dict(self) -> dict:
        d = asdict(self)
        d["honest_reward_points"] = self.honest_reward_points
        d["p_end"] = self.p_end
        return d


def schedule(s: Scenario) -> list[tuple[str, int]]:
    """The ratings in arrival order: (key, draw index). Honest draw indexes are the same in every run
    (round * keys + key); the attacker's are negative (its own stream). In each half the attacker
    rates right after the honest rating that brings it below its share of that half."""
    events: list[tuple[str, int]] = []
    half, attacks = s.ratings_per_key // 2, 0
    for phase, rounds in enumerate((range(half), range(half, s.ratings_per_key))):
        share, honest, mine = (s.early_share, s.late_share)[phase], 0, 0
        for rnd in rounds:
            for k in range(s.honest_keys):
                events.append((f"honest-{k:03d}", rnd * s.honest_keys + k))
                honest += 1
                while s.attack and mine < int(share / (1 - share) * honest):
                    mine, attacks = mine + 1, attacks + 1
                    events.append((ATTACKER, -attacks))
    return events


def learning_rule(name: str):
    """The [learner] settings a run learns with: "default" (the shipped rule for the tiny model this bench runs on:
    configs/serve/tiny.toml over default.toml) or "bare" (the dataclass's)."""
    from liveloop.config import load_config
    from liveloop.learner.config import LearnerConfig

    if name == "bare":
        return LearnerConfig()
    return load_config("tiny" if name == "default" else name).learner


def _uniform(seed: int, draw: int) -> float:
    """The fixed uniform number of one draw: the same in every run of a seed."""
    import random

    return random.Random(f"{seed}:{draw}").random()


def world_config(learner: str, workdir: Path, seed: int, batch_size: int, window: int, defended: bool, window_cap: int,
                 method: str = "sliding_window"):
    """The [learner] a world runs: the learning rule, B with at most one sample of a key per step and the
    key's window cap when defended, no publishing (the policy is read in process)."""
    from liveloop.learner.config import SlidingWindowConfig

    return dataclasses.replace(
        learning_rule(learner),
        checkpoint_dir=str(workdir / "versions"), batch_size=batch_size, max_batch_size=0, publish_every_steps=10**9, publish_every_seconds=1e9,
        lambda_alpha=1.0, seed=seed, method=method, sliding_window=SlidingWindowConfig(window=window),
        max_per_key_per_batch=1 if defended else batch_size, max_per_key_per_window=window_cap if defended else 0,
        influence_window_seconds=3600.0,
    )


class World:
    """The in-process world this bench and bench/collusion.py run: a real SQLite store, the real
    `OnlineLearner`, the fixed prompts and the target token. `serve(i, key, draw, rate)` draws ONE token
    from the learner's current policy with the draw's fixed uniform (a slightly different policy draws
    the same reply) and stores it with `rate(is_target)` as `key`'s rating; `train()` takes every step
    the learner can and returns the target's probability after each."""

    def __init__(self, workdir: Path, model_dir: Path, config, seed: int):
        from transformers import AutoTokenizer

        from liveloop.critic.config import CriticConfig
        from liveloop.learner.online import OnlineLearner
        from liveloop.rl.rollout import chat_prompt_ids
        from liveloop.store import Store, StoreConfig

        workdir.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.store = Store(StoreConfig(url=f"sqlite:///{workdir / 'world.db'}"))
        self.store.migrate()
        self.store.versions.ensure_base_version(str(model_dir))
        self.learner = OnlineLearner.resume(
            config, CriticConfig(), model_dir,
            feedback=self.store.feedback, versions=self.store.versions, operator=self.store.operator, episodes=self.store.episodes,
        )
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.target = tok.convert_tokens_to_ids(TARGET)
        self.prompts = [chat_prompt_ids(tok, p) for p in PROMPTS]

    def _next_token_logprobs(self, prompt: list[int]):
        import torch

        with torch.no_grad():
            self.learner.policy.eval()
            return torch.log_softmax(self.learner.policy(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)

    def p_target(self) -> float:
        return sum(self._next_token_logprobs(p)[self.target].exp().item() for p in self.prompts) / len(self.prompts)

    def serve(self, i: int, key: str, draw: int, rate) -> None:
        import torch

        from liveloop.store import FeedbackRecord, ResponseRecord

        prompt = self.prompts[(draw % len(self.prompts)) if draw >= 0 else (-draw) % len(self.prompts)]
        lp = self._next_token_logprobs(prompt)
        u = _uniform(self.seed, draw)  # inverse-CDF with a fixed u
        token = min(int(torch.searchsorted(torch.cumsum(lp.double().exp(), 0), torch.tensor([u], dtype=torch.float64))), lp.numel() - 1)
        rid = f"r{i}"
        self.store.feedback.write_batch([ResponseRecord(
            rid, key, "liveloop-tiny", self.learner.state.version, "chat", tuple(prompt), (token,), (float(lp[token]),),
            "length", 1.0, 1.0, 1.0,
        )])
        self.store.feedback.put_feedback(FeedbackRecord(rid, key, rate(token == self.target)))

    def train(self) -> list[float]:
        trace = []
        while self.learner.step():
            trace.append(self.p_target())
        return trace


def run(s: Scenario, workdir: Path, model_dir: Path) -> RunResult:
    from liveloop.monitor.poisoning import disagreement_scores, suspects

    started = time.perf_counter()
    config = world_config(s.learner, workdir, s.seed, s.batch_size, s.window, s.defended, s.cap_per_window or s.ratings_per_key, s.method)
    if s.learning_rate is not None:
        config = dataclasses.replace(config, learning_rate=s.learning_rate, min_learning_rate=min(s.learning_rate, config.min_learning_rate),
                                     max_learning_rate=max(s.learning_rate, config.max_learning_rate))
    world = World(workdir, model_dir, config, s.seed)
    store, learner = world.store, world.learner

    def quarantine_check() -> None:
        scores = disagreement_scores(store.keys.key_ratings(20000), exclude_from_consensus=store.keys.quarantined_keys())
        for bad in suspects(scores, s.quarantine_z, s.quarantine_min_ratings):
            store.keys.set_quarantined(bad.key_id, True, f"disagreement z={bad.z:.1f} over {bad.n} ratings")

    p_before = world.p_target()
    trace: list[float] = []
    events = schedule(s)
    quarantined_at = None
    for i, (key, draw) in enumerate(events):
        world.serve(i, key, draw, (lambda hit: int(not hit)) if key == ATTACKER else int)
        if s.defended and (i + 1) % s.check_every == 0:
            quarantine_check()
            if quarantined_at is None and ATTACKER in store.keys.quarantined_keys():
                quarantined_at = i + 1
        trace += world.train()
    if s.defended:
        quarantine_check()
    scores = {d.key_id: d for d in disagreement_scores(store.keys.key_ratings(20000))}
    honest_z = [d.z for k, d in scores.items() if k != ATTACKER]
    result = RunResult(
        scenario=s,
        p_before=p_before,
        p_after=world.p_target(),
        p_trace=trace,
        honest_ratings=sum(1 for k, _ in events if k != ATTACKER),
        attacker_ratings=sum(1 for k, _ in events if k == ATTACKER),
        trained=learner.state.samples,
        capped=int(learner.method.stats().get("learner/capped_ratings", 0)),
        quarantined=sorted(store.keys.quarantined_keys()),
        quarantined_after_ratings=quarantined_at,
        attacker_z=scores[ATTACKER].z if ATTACKER in scores else None,
        max_honest_z=max(honest_z) if honest_z else None,
        seconds=time.perf_counter() - started,
    )
    store.close()
    return result


@dataclass(frozen=True)
class Comparison:
    no_attack: RunResult
    undefended: RunResult
    defended: RunResult

    @property
    def taught(self) -> float:
        """What honest feedback alone moved the target by (no attack: end minus start)."""
        return self.no_attack.p_end - self.no_attack.p_before

    @property
    def undefended_shift(self) -> float:
        """Movement caused by the attack without defences (probability, attacked - no attack)."""
        return self.undefended.p_end - self.no_attack.p_end

    @property
    def defended_shift(self) -> float:
        return self.defended.p_end - self.no_attack.p_end

    @property
    def defended_fraction(self) -> float:
        """|defended shift| / |undefended shift|."""
        return abs(self.defended_shift) / abs(self.undefended_shift) if self.undefended_shift else float("inf")

    @property
    def honest_reward_gap_points(self) -> float:
        return self.defended.honest_reward_points - self.no_attack.honest_reward_points

    def as_dict(self) -> dict:
        return {
            "no_attack": self.no_attack.as_dict(),
            "undefended": self.undefended.as_dict(),
            "defended": self.defended.as_dict(),
            "taught": self.taught,
            "undefended_shift": self.undefended_shift,
            "defended_shift": self.defended_shift,
            "defended_fraction": self.defended_fraction,
            "honest_reward_gap_points": self.honest_reward_gap_points,
        }


def compare(workdir: Path, model_dir: Path, **scenario) -> Comparison:
    return Comparison(
        no_attack=run(Scenario(attack=False, defended=True, **scenario), workdir / "no_attack", model_dir),
        undefended=run(Scenario(attack=True, defended=False, **scenario), workdir / "undefended", model_dir),
        defended=run(Scenario(attack=True, defended=True, **scenario), workdir / "defended", model_dir),
    )


def main() -> None:
    import tempfile

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import default_model, save

    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--honest-keys", type=int, default=128)
    ap.add_argument("--ratings-per-key", type=int, default=6)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--learner", default="default", help='the learning rule: a config preset ("default") or "bare" (no step control, no anchor)')
    ap.add_argument("--model", type=Path, help="a model directory (default: the default model)")
    args = ap.parse_args()
    model_dir = args.model or default_model()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            c = compare(Path(tmp) / f"seed{seed}", model_dir, honest_keys=args.honest_keys, ratings_per_key=args.ratings_per_key, seed=seed, learner=args.learner)
            runs.append({"seed": seed} | c.as_dict())
            print(json.dumps({k: runs[-1][k] for k in ("seed", "undefended_shift", "defended_shift", "defended_fraction", "honest_reward_gap_points")}), flush=True)
    fractions = [r["defended_fraction"] for r in runs]
    summary = {
        "learner": args.learner,
        "honest_keys": args.honest_keys,
        "ratings_per_key": args.ratings_per_key,
        "runs": runs,
        "defended_fraction_max": max(fractions),
        "defended_fraction_mean": sum(fractions) / len(fractions),
        "honest_reward_gap_points_max_abs": max(abs(r["honest_reward_gap_points"]) for r in runs),
    }
    path = save(f"poisoning_{args.learner}", summary, model_dir=model_dir)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
