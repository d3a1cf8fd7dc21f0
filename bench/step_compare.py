"""The learner's step before issue 36 and now, side by side in one process, and where a step's time goes
(`bench/learner_batch.py --compare` and `--profile` run this; bench/ is not a package).

Two learners from the same start: "old" (`learner/reference_step.py`'s `ReferenceLearner`, the step of
commit a4a7356 with its durable checkpoints on a thread) and "new" (`OnlineLearner`), each on its own real
SQLite store holding the same rated replies (sampled from the tiny model to the default prompts, 32
tokens at most, every third rated up, a key each), on the `default` preset's [learner] and [critic]
(the default's step-size control, trust region and exact KL anchor) with adaptive batching up to `b`.
They take turns, `--block` steps each, the order swapping every round, so both see the same machine
noise. Arms:
  step    no publishing: the step alone (what `busy_seconds` counts)
  served  a version after every step through the shared-memory transport, durable checkpoints as each
          learner writes them (old: a thread beside the steps; new: the learner's idle turns, or before a
          third version): what the server's learner does on the default config with ratings waiting
  coalesce  as served, the new learner with `[learner] coalesce_versions` on (ratings are always waiting
          here: a version every publish_every_seconds, 0.5 s, and the rest superseded)
Reported per arm and learner: samples per busy second (the learner's own `busy_seconds`, as
/admin/learner reports it), samples per wall second (steps, publishing and durable writes), the ratio
new / old of each, and the step's breakdown (ms per step of each part; wrappers around the learners'
own methods). `--profile` records torch.profiler over steps of each learner instead: the op table, the
phase table (record_function ranges of the same parts), Python stacks in the collapsed format a flame
graph renders (flamegraph.pl, speedscope), and a Chrome trace of the new step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import secrets
import time
from collections import Counter
from pathlib import Path

import torch

PARTS = (  # (label, object path on the learner, method): what a step's time is split into
    ("critic values + K value steps", None, None),
    ("KL reference forward", "", "_reference_log_dists"),
    ("policy forward + loss", "", "_objective"),
    ("policy backward + AdamW", "policy_opt", "step"),
    ("step KL forward (+ cut-backs)", "", "_step_kl"),
    ("advantages (GAE)", "method", "advantages"),
    ("stability window", "window", "add"),
)


def replies(model_dir: Path, n: int) -> list:
    from common import rated_samples

    return [dataclasses.replace(s, reward=float(i % 3 == 0)) for i, s in enumerate(rated_samples(model_dir, n, max_tokens=32))]


def fill(store, samples, count: int) -> None:
    from liveloop.store import FeedbackRecord, ResponseRecord

    for i in range(count):
        s = samples[i % len(samples)]
        rec = ResponseRecord(
            f"r{i}", f"k{i}", "m", 0, "chat", tuple(int(x) for x in s.prompt_ids), tuple(int(x) for x in s.response_ids),
            tuple(float(x) for x in s.behavior_logprobs), "stop", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(rec.id, rec.api_key_id, int(s.reward)))


def build(kind: str, tmp: Path, model_dir: Path, samples, count: int, batch: int, served: bool, coalesce: bool = False):
    from liveloop.config import load_config
    from liveloop.learner.online import OnlineLearner
    from liveloop.learner.reference_step import ReferenceLearner
    from liveloop.store import Store, StoreConfig
    from liveloop.transport import TransportConfig

    cfg = load_config("default")
    store = Store(StoreConfig(url=f"sqlite:///{tmp / kind}.db"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    fill(store, samples, count)
    learner_cfg = dataclasses.replace(
        cfg.learner, checkpoint_dir=str(tmp / kind / "versions"), max_batch_size=batch, max_per_key_per_window=0,
        publish_every_steps=1 if served else 10**9, publish_every_seconds=0.5 if served else 1e9,
    )
    transport = TransportConfig(backend="shared_memory", namespace="b" + secrets.token_hex(5)) if served else None
    if coalesce and kind == "new":
        learner_cfg = dataclasses.replace(learner_cfg, coalesce_versions=True)
    cls = ReferenceLearner if kind == "old" else OnlineLearner
    return cls.resume(
        learner_cfg, cfg.critic, model_dir, transport=transport,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    ), store


@contextlib.contextmanager
def instrument(learner, kind: str, times: Counter, label_ranges: bool = False):
    """While open, the learner's parts (PARTS) add their seconds to `times` (and, for the profiler, open a
    record_function range named after each); the old step's module functions are put back on close."""
    import liveloop.learner.reference_step as reference

    originals = []

    def wrap(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, **kw):
            scope = torch.profiler.record_function(label) if label_ranges else contextlib.nullcontext()
            started = time.perf_counter()
            with scope:
                out = f(*a, **kw)
            times[label] += time.perf_counter() - started
            return out

        originals.append((owner, name, f))
        setattr(owner, name, timed)

    critic = PARTS[0][0]
    if kind == "old":  # the old step calls these module functions
        for name in ("reference_critic_values", "reference_critic_update"):
            wrap(reference, name, critic)
    else:
        wrap(learner.critic, "values_for_update", critic)
        wrap(learner.critic, "update", critic)
    for label, path, name in PARTS[1:]:
        wrap(functools.reduce(getattr, path.split("."), learner) if path else learner, name, label)
    try:
        yield
    finally:
        for owner, name, f in originals:
            if owner is reference:
                setattr(owner, name, f)


def compare(args, model_dir: Path, tmp: Path) -> list[dict]:
    samples = replies(model_dir, 48)
    rows = []
    for arm in args.arms:
        for b in args.batches:
            rows.append(_compare_arm(args, model_dir, tmp / f"{arm}-{b}", samples, b, arm))
    return rows


def _compare_arm(args, model_dir: Path, tmp: Path, samples, b: int, arm: str) -> dict:
    count = (args.steps + 2 * args.block) * b
    served, coalesce = arm in ("served", "coalesce"), arm == "coalesce"
    learners = {kind: build(kind, tmp, model_dir, samples, count, b, served, coalesce) for kind in ("old", "new")}
    times = {kind: Counter() for kind in learners}
    with instrument(learners["old"][0], "old", times["old"]), instrument(learners["new"][0], "new", times["new"]):
        row = _take_turns(args, learners, times, arm, b)
    for kind, (learner, store) in learners.items():
        learner.publishing.release_memory()
        if learner.transport is not None:
            _remove_namespace(learner.transport.namespace)
        store.close()
    print_row(row)
    return row


def _remove_namespace(namespace: str) -> None:
    import shutil

    from liveloop.transport import shared_memory as shm

    for version in shm.segments(namespace):
        shm.remove_version(namespace, version)
    shutil.rmtree(shm.directory(namespace), ignore_errors=True)


def _take_turns(args, learners: dict, times: dict, arm: str, b: int) -> dict:
    for learner, _ in learners.values():
        learner.step()  # warm-up, not counted
        learner.publishing.wait_durable()
    busy = dict.fromkeys(learners, 0.0)
    wall = dict.fromkeys(learners, 0.0)
    steps, samples_done = Counter(), Counter()
    for kind in learners:
        times[kind].clear()
    rounds = 0
    while min(steps.values(), default=0) < args.steps:
        for kind in (("old", "new") if rounds % 2 == 0 else ("new", "old")):
            learner = learners[kind][0]
            b0, n0, started = learner.busy_seconds, learner.state.samples, time.perf_counter()
            for _ in range(args.block):
                steps[kind] += int(learner.step())
            learner.publishing.wait_durable()  # a block's durable writes are its own (wall), never the next block's
            wall[kind] += time.perf_counter() - started
            busy[kind] += learner.busy_seconds - b0
            samples_done[kind] += learner.state.samples - n0
        rounds += 1
    row = {"arm": arm, "batch": b, "steps": dict(steps), "samples": dict(samples_done)}
    for kind in learners:
        row[f"{kind}_samples_per_busy_s"] = samples_done[kind] / busy[kind]
        row[f"{kind}_samples_per_wall_s"] = samples_done[kind] / wall[kind]
        row[f"{kind}_ms_per_step"] = {k: 1000 * v / steps[kind] for k, v in times[kind].items()}
        row[f"{kind}_ms_per_step"]["busy (the whole step)"] = 1000 * busy[kind] / steps[kind]
        row[f"{kind}_ms_per_step"]["wall (step, publish, durable)"] = 1000 * wall[kind] / steps[kind]
        learner = learners[kind][0]
        row[f"{kind}_trust_region"] = {"cut": learner.state.cut_steps, "undone": learner.state.rejected_steps, "jumps": learner.state.jumps}
        row[f"{kind}_versions"] = learner.state.version
    row["new_superseded_versions"] = learners["new"][0].publishing.superseded
    row["busy_ratio_new_over_old"] = row["new_samples_per_busy_s"] / row["old_samples_per_busy_s"]
    row["wall_ratio_new_over_old"] = row["new_samples_per_wall_s"] / row["old_samples_per_wall_s"]
    return row


def print_row(row: dict) -> None:
    print(f"\n{row['arm']} arm, batch <= {row['batch']}: steps {row['steps']}, samples {row['samples']}", flush=True)
    print("| part (ms per step) | old | new |\n|---|---|---|")
    old, new = row["old_ms_per_step"], row["new_ms_per_step"]
    for label in [p[0] for p in PARTS] + ["busy (the whole step)", "wall (step, publish, durable)"]:
        print(f"| {label} | {old.get(label, 0.0):.2f} | {new.get(label, 0.0):.2f} |")
    print(f"| samples per busy second | {row['old_samples_per_busy_s']:.1f} | {row['new_samples_per_busy_s']:.1f} "
          f"(x{row['busy_ratio_new_over_old']:.2f}) |")
    print(f"| samples per wall second | {row['old_samples_per_wall_s']:.1f} | {row['new_samples_per_wall_s']:.1f} "
          f"(x{row['wall_ratio_new_over_old']:.2f}) |", flush=True)
    print(f"trust region: old {row['old_trust_region']}, new {row['new_trust_region']}; versions: old {row['old_versions']}, "
          f"new {row['new_versions']} (superseded {row['new_superseded_versions']})")


def profile(args, model_dir: Path, tmp: Path, results: Path) -> dict:
    """torch.profiler over `args.steps` steps of each learner (batch `args.batches[0]`): op and phase tables,
    collapsed Python stacks (a flame graph's input) and the new step's Chrome trace, under `results`."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    samples = replies(model_dir, 48)
    b = args.batches[0]
    out = {}
    for kind in ("old", "new"):
        learner, store = build(kind, tmp / f"profile-{kind}", model_dir, samples, (args.steps + 6) * b, b, False)
        with instrument(learner, kind, Counter(), label_ranges=True):
            for _ in range(3):
                learner.step()
            verbose = torch._C._profiler._ExperimentalConfig(verbose=True)  # keeps the Python frames export_stacks reads
            with torch_profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=verbose) as prof:
                for _ in range(args.steps):
                    learner.step()
            if kind == "new":  # a short trace without stacks (with them it is 100+ MB): the parts on a timeline
                with torch_profile(activities=[ProfilerActivity.CPU]) as short:
                    for _ in range(2):
                        learner.step()
                short.export_chrome_trace(str(results / "learner_step_trace_new.json"))
        averages = [e for e in prof.key_averages() if e.key.startswith(("aten::", "autograd::", "Optimizer."))]
        ops = "\n".join(f"{e.key[:60]:60s} {e.self_cpu_time_total / 1000 / args.steps:8.2f} ms self per step  {e.count / args.steps:7.1f} calls"
                         for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:30])
        phases = [e for e in prof.key_averages() if e.key in {p[0] for p in PARTS}]
        phase_table = "\n".join(f"{e.key:40s} {e.cpu_time_total / 1000 / args.steps:8.2f} ms per step ({e.count} calls)"
                                for e in sorted(phases, key=lambda e: -e.cpu_time_total))
        (results / f"learner_step_profile_{kind}.txt").write_text(
            f"{kind} step, batch <= {b}, {args.steps} steps under torch.profiler (with stacks: slower than unprofiled)\n\n"
            f"phases (record_function ranges, CPU time incl. children):\n{phase_table}\n\nops by self CPU time (top 30):\n{ops}\n"
        )
        _collapsed_stacks(prof, results / f"learner_step_stacks_{kind}.txt")
        out[kind] = {"phases_ms_per_step": {e.key: e.cpu_time_total / 1000 / args.steps for e in phases}}
        print(f"\n{kind} step under torch.profiler:\n{phase_table}", flush=True)
        store.close()
    return out


def _collapsed_stacks(prof, path: Path) -> None:
    """The profile's Python stacks with their self CPU microseconds, one line per distinct stack (what
    flamegraph.pl and speedscope read); export_stacks writes a line per event, 100+ MB for ten steps."""
    prof.export_stacks(str(path), "self_cpu_time_total")
    total: Counter = Counter()
    with path.open() as lines:
        for line in lines:
            stack, _, us = line.rstrip("\n").rpartition(" ")
            if stack and us.isdigit():
                total[stack] += int(us)
    path.write_text("".join(f"{stack} {us}\n" for stack, us in total.most_common()))
