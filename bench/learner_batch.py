"""The learner's work per rating against its batch size, and what bfloat16 weights cost in accuracy.

Throughput: a real SQLite store holds N rated responses (random tokens, a P-token prompt and an L-token
response each); for each batch size b a fresh `OnlineLearner` (SAO: reference forward when the KL anchor
is on, critic forward, K critic steps, one policy step) trains through all of them with adaptive
batching (`max_batch_size = b`), the first step excluded as warm-up; ratings/s = ratings / seconds.

Precision (`--precision`): from the same start, the same fixed batch of 8 ratings trained for S steps
under float32, bfloat16 with fp32 master weights and moments (the default on a GPU), and bfloat16 with
bfloat16 optimizer state (behaviour logprobs: the base model's own, so nothing is masked); reported: the
weights' total update after the steps, and its relative distance from float32's update
||u_arm - u_fp32|| / ||u_fp32||.

    .venv/bin/python bench/learner_batch.py                                 # CPU, tiny model, b = 1, 4, 16
    .venv/bin/python bench/learner_batch.py --device cuda --shape 1.7b --length 512 --batches 1,4,16,32
    .venv/bin/python bench/learner_batch.py --precision
    .venv/bin/python bench/learner_batch.py --compare [--arms step,served,coalesce] [--batches 1] [--steps 60]
    .venv/bin/python bench/learner_batch.py --profile [--batches 1] [--steps 10]

`--compare`: the step before issue 36 (learner/reference_step.py) and now, side by side in this process,
in turns: samples per busy second old / new as a ratio, and the step's breakdown (bench/step_compare.py).
`--profile`: torch.profiler over each step's parts (tables, flame-graph stacks, a Chrome trace).

`--shape` builds a Qwen3-shaped model with random weights from a config (no downloads): tiny (the
default model), 0.6b, 1.7b. Writes bench/results/learner_batch.json (learner_step_compare.json,
learner_step_profile_*.txt, learner_step_stacks_*.txt, learner_step_trace_new.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, save  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # Qwen3 dense shapes (hidden, layers, heads, kv heads, intermediate)
    "0.6b": (1024, 28, 16, 8, 3072),
    "1.7b": (2048, 28, 16, 8, 6144),
    "8b": (4096, 36, 32, 8, 12288),
}


def build_shape(shape: str, out: Path) -> Path:
    """A Qwen3-shaped causal LM with random weights saved at `out` (the tiny tokenizer's vocab is not
    needed: the benchmark feeds token ids)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, layers, heads, kv, inter = SHAPES[shape]
    config = Qwen3Config(
        vocab_size=151936, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, head_dim=128, max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init is minutes on a CPU
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    return out


def model_dir(args: argparse.Namespace, tmp: Path) -> Path:
    if args.model:
        return Path(args.model)
    if args.shape != "tiny":
        return build_shape(args.shape, tmp / f"qwen3-{args.shape}")
    from common import default_model

    return default_model()


def fill(store, n: int, prompt: int, length: int, vocab: int, seed: int = 0, tag: str = "", policy=None) -> None:
    """n rated responses of random tokens; behaviour logprobs -2, or `policy`'s own (nothing masked)."""
    from liveloop.store import FeedbackRecord, ResponseRecord

    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        ids = torch.randint(5, vocab, (prompt + length,), generator=g)
        lps = (-2.0,) * length
        if policy is not None:
            with torch.no_grad():
                logits = policy(input_ids=ids[None]).logits[0, prompt - 1 : -1].float()
            lps = tuple(torch.log_softmax(logits, -1).gather(1, ids[prompt:, None])[:, 0].tolist())
        ids = ids.tolist()
        rec = ResponseRecord(
            f"r{seed}-{i}{tag}", f"k{i}", "m", 0, "chat", tuple(ids[:prompt]), tuple(ids[prompt:]), lps,
            "length", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(rec.id, rec.api_key_id, i % 2))


def new_store(tmp: Path, name: str, base: Path):
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=f"sqlite:///{tmp / name}.db"))
    store.migrate()
    store.versions.ensure_base_version(str(base))
    return store


def learner_config(tmp: Path, **kw):
    from liveloop.learner.config import LearnerConfig

    base = dict(
        checkpoint_dir=str(tmp / "versions"), publish_every_steps=10**6, publish_every_seconds=1e9,
        max_per_key_per_batch=10**6, kl_coef=0.05, kl_estimator="exact",
    )
    return LearnerConfig(**(base | kw))


def throughput(args: argparse.Namespace, base: Path, tmp: Path) -> list[dict]:
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.online import OnlineLearner

    vocab = _vocab(base)
    rows = []
    for b in args.batches:
        n = max(args.ratings, 3 * b)
        store = new_store(tmp, f"tp{b}", base)
        fill(store, n + b, args.prompt, args.length, vocab)  # the first step (b ratings) warms up
        cfg = learner_config(tmp, device=args.device, dtype=args.dtype, max_batch_size=b, gradient_checkpointing=args.checkpointing)
        learner = OnlineLearner.resume(
            cfg, CriticConfig(), base,
            feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
        )
        learner.step()
        _sync()
        start = time.perf_counter()
        while learner.step():
            pass
        _sync()
        seconds = time.perf_counter() - start
        done = learner.state.samples - b
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        rows.append({"batch": b, "ratings": done, "seconds": seconds, "ratings_per_s": done / seconds, "peak_gib": peak})
        print(f"batch {b:3d}: {done} ratings in {seconds:.2f} s = {done / seconds:.2f} ratings/s", flush=True)
        del learner
        store.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    one = rows[0]["ratings_per_s"]
    for r in rows:
        r["vs_batch_1"] = r["ratings_per_s"] / one
    return rows


def precision(args: argparse.Namespace, base: Path, tmp: Path) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from liveloop.critic.config import CriticConfig
    from liveloop.learner.online import OnlineLearner

    arms = [("float32", "float32", True), ("bfloat16 + fp32 master/moments", "bfloat16", True), ("bfloat16 state", "bfloat16", False)]
    behaviour = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    results, fp32_update = [], None
    for name, dtype, master in arms:
        store = new_store(tmp, f"pr-{dtype}-{master}", base)
        for step in range(args.precision_steps):  # the same 8 ratings, again each step, on-policy at the start
            fill(store, 8, args.prompt, args.length, _vocab(base), seed=0, tag=f"-step{step}", policy=behaviour)
        cfg = learner_config(tmp, device=args.device, dtype=dtype, master_weights=master, batch_size=8, seed=0)
        learner = OnlineLearner.resume(
            cfg, CriticConfig(), base,
            feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
        )
        start = [p.detach().float().clone() for p in learner.policy.parameters()]
        losses = []
        while learner.step():
            losses.append(learner.state.last_metrics["learner/policy_loss"])
        update = torch.cat([(p.detach().float() - s0).flatten() for p, s0 in zip(learner.policy.parameters(), start)]).cpu()
        fp32_update = update if fp32_update is None else fp32_update
        error = float((update - fp32_update).norm() / fp32_update.norm())
        results.append({"arm": name, "steps": len(losses), "final_policy_loss": losses[-1], "update_error_vs_fp32": error,
                        "update_norm": float(update.norm())})
        print(f"{name:32s} steps {len(losses)}  final loss {losses[-1]:+.5f}  |update| {float(update.norm()):.4f}  "
              f"relative error of the update vs float32 {error:.3f}", flush=True)
        store.close()
    return results


def _vocab(base: Path) -> int:
    return min(json.loads((base / "config.json").read_text())["vocab_size"], 32000)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint directory (default: the tiny model, or --shape)")
    parser.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny")
    parser.add_argument("--build", type=Path, help="only build --shape's model into this directory")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--ratings", type=int, default=48, help="ratings timed per batch size (at least 3 steps)")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    parser.add_argument("--precision", action="store_true", help="compare float32 / bfloat16 optimizer states instead")
    parser.add_argument("--precision-steps", type=int, default=10)
    parser.add_argument("--compare", action="store_true", help="the step before issue 36 and now, side by side (bench/step_compare.py)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler over the old and the new step")
    parser.add_argument("--arms", default="step,served", help="--compare: step, served, coalesce")
    parser.add_argument("--steps", type=int, default=60, help="--compare: steps timed per learner; --profile: steps profiled")
    parser.add_argument("--block", type=int, default=5, help="--compare: steps a learner takes per turn")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.arms = args.arms.split(",")
    if args.compare or args.profile:
        step_comparison(args)
        return
    if args.build:
        print(build_shape(args.shape, args.build))
        return
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = model_dir(args, Path(tmp))
        result = {"model": args.model or args.shape, "device": args.device, "dtype": args.dtype, "prompt": args.prompt, "length": args.length}
        if args.precision:
            result["precision"] = precision(args, base, Path(tmp))
        else:
            result["throughput"] = throughput(args, base, Path(tmp))
            print("\n| batch | ratings/s | vs batch 1 |\n|---|---|---|")
            for r in result["throughput"]:
                print(f"| {r['batch']} | {r['ratings_per_s']:.2f} | {r['vs_batch_1']:.2f}x |")
        print(f"wrote {save('learner_precision' if args.precision else 'learner_batch', result, model_dir=base)}")


def step_comparison(args: argparse.Namespace) -> None:
    import step_compare

    torch.set_num_threads(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = model_dir(args, Path(tmp))
        if args.profile:
            result = {"profile": step_compare.profile(args, base, Path(tmp), RESULTS), "batch": args.batches[0], "steps": args.steps}
            print(f"wrote {save('learner_step_profile', result, model_dir=base)} and the tables, stacks and trace beside it")
            return
        rows = step_compare.compare(args, base, Path(tmp))
    print("\n| arm | batch <= | old samples/busy s | new | new / old | old samples/wall s | new | new / old |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['batch']} | {r['old_samples_per_busy_s']:.1f} | {r['new_samples_per_busy_s']:.1f} | "
              f"{r['busy_ratio_new_over_old']:.2f}x | {r['old_samples_per_wall_s']:.1f} | {r['new_samples_per_wall_s']:.1f} | "
              f"{r['wall_ratio_new_over_old']:.2f}x |")
    print(f"wrote {save('learner_step_compare', {'rows': rows, 'steps': args.steps, 'block': args.block}, model_dir=base)}")


if __name__ == "__main__":
    main()
