"""The learner on a real model (SmolLM2-135M by default): where its memory goes, its seconds per rated
reply against the compute floor, and whole-policy updates against a LoRA adapter's.

For each arm a fresh learner (`learner.lanes.build_learner`, as the server's actor builds it) trains on
the same N rated replies in a real SQLite store (SmolLM2's own replies to chat prompts, L tokens each,
sampled at temperature 1 with their behaviour logprobs: the ratio starts at 1). Reported per arm:
- memory: the process's resident set before and after building and after the steps, and the tensors it
  holds by owner (policy weights, trainable weights, gradients, optimizer moments, the KL reference, the
  critic), counted by storage so a tensor shared by two owners counts once;
- the seconds per rating of steps 2..N, against the compute floor: the same forward and backward passes
  over the same batch through the same modules in a bare torch loop (critic: K forwards and backwards;
  policy: the reference's forward, a forward and backward, the step-KL forward), timed in turns with the
  learner's steps in this process, one thread;
- the first step's step KL and whether the trust region let it stand;
- the peak resident set over the steps (the kernel's high-water mark, reset before them).
Arm `lora_whole_logits` is `lora` with the step as it was before the learner kept only the response
positions' logits (`rl.batch.policy_log_dists`): the head over every prompt position too, side by side.

    .venv/bin/python bench/learner_real.py                          # SmolLM2, arms lora and full, 6 ratings of 100 tokens
    .venv/bin/python bench/learner_real.py --arms lora --ratings 10 --length 100
    .venv/bin/python bench/learner_real.py --model models/liveloop-tiny --arms full
    .venv/bin/python bench/learner_real.py --arms lora lora_whole_logits --prompt-words 1500   # a long prompt

Writes bench/results/OUT.json (`--out`, learner_real by default).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, save  # noqa: E402  (bench/ is not a package)

PROMPTS = ("Tell me about cats.", "What should I cook tonight?", "Explain why the sky is blue.",
           "Write a short note to a friend.", "How do trains work?", "Give me advice on sleeping well.")
ARMS = {  # ([segments] adapters, [learner] keys, [critic] keys) over the default preset's
    "lora": ("shared", {}, {"lora_rank": 8}),
    "lora_whole_logits": ("shared", {}, {"lora_rank": 8}),
    "lora_recompute": ("shared", {"recompute_over_tokens": 1}, {"lora_rank": 8}),  # every step's activations recomputed
    "lora_mlp_critic": ("shared", {}, {"lora_rank": 0}),
    "full": ("none", {"learning_rate": 1e-5, "min_learning_rate": 1e-7}, {"lora_rank": 8}),
    "full_mlp_critic": ("none", {"learning_rate": 1e-5, "min_learning_rate": 1e-7}, {"lora_rank": 0}),
}


def rss_gib() -> float:
    return psutil.Process().memory_info().rss / 2**30


def reset_peak() -> None:
    """Start the kernel's resident high-water mark (VmHWM) over from the current resident set."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmHWM in /proc/self/status")


@contextlib.contextmanager
def whole_logits(on: bool):
    """The step as before `policy_log_dists`: every position's logits (the learner's head over the prompt too)."""
    from liveloop.rl.batch import TokenBatch

    kept = TokenBatch.scored_positions
    if on:
        TokenBatch.scored_positions = property(lambda self: self.input_ids.shape[1])
    try:
        yield
    finally:
        TokenBatch.scored_positions = kept


def replies(model_dir: Path, n: int, length: int, seed: int = 0, prompt_words: int = 0) -> list[tuple[list[int], list[int], list[float]]]:
    """n (prompt ids, reply ids, behaviour logprobs): the model's own replies at temperature 1 (`prompt_words`:
    that many words of a notes document before each question, as an agent's or a RAG app's long prompt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for i in range(n):
        torch.manual_seed(seed + i)
        notes = " ".join(f"note {j}: the item is ready." for j in range(prompt_words // 5))
        question = (notes + "\n\n" if notes else "") + PROMPTS[i % len(PROMPTS)]
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         return_dict=True, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ids = model.generate(prompt, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=length,
                                 min_new_tokens=length)[0]
            logits = model(input_ids=ids[None]).logits[0, prompt.shape[1] - 1 : -1]
        reply = ids[prompt.shape[1]:]
        lps = torch.log_softmax(logits.float(), -1).gather(1, reply[:, None])[:, 0]
        out.append((prompt[0].tolist(), reply.tolist(), lps.tolist()))
    del model
    gc.collect()
    return out


def fill_store(tmp: Path, model_dir: Path, rated, segment: str | None) -> object:
    from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

    store = Store(StoreConfig(url=f"sqlite:///{tmp / 'store.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    for i, (prompt, reply, lps) in enumerate(rated):
        rec = ResponseRecord(f"r{i}", f"k{i}", "m", 0, "chat", tuple(prompt), tuple(reply), tuple(lps), "length", 1.0, 1.0, 1.0,
                             segment=segment)
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(rec.id, rec.api_key_id, i % 2))
    return store


def tensor_bytes(learner) -> dict[str, float]:
    """GiB held by each owner, each storage counted once (the first owner that names it)."""
    lane = learner if not hasattr(learner, "lanes") else next(iter(learner.lanes.values()))
    seen: set[int] = set()
    out: dict[str, float] = {}

    def count(owner: str, tensors) -> None:
        total = 0
        for t in tensors:
            if t is None or not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key in seen:
                continue
            seen.add(key)
            total += t.untyped_storage().nbytes()
        out[owner] = out.get(owner, 0.0) + total / 2**30

    policy = lane.policy_opt.module
    params = list(policy.parameters())
    count("policy trainable weights", [p for p in params if p.requires_grad])
    count("policy gradients", [p.grad for p in params])
    count("policy frozen weights", [p for p in params if not p.requires_grad])
    count("policy optimizer moments", [v for s in lane.policy_opt.optimizer.state.values() for v in s.values()])
    if lane.reference is not None:
        count("KL reference (a second copy)", list(lane.reference.parameters()))
    if lane.critic is not None:
        cp = list(lane.critic.model.parameters())
        count("critic trainable weights", [p for p in cp if p.requires_grad])
        count("critic gradients", [p.grad for p in cp])
        count("critic frozen weights", [p for p in cp if not p.requires_grad])
        count("critic optimizer moments", [v for s in lane.critic.optimizer.optimizer.state.values() for v in s.values()])
    return {k: round(v, 3) for k, v in out.items()}


def floor_seconds(lane, batch, value_steps: int) -> float:
    """One step's passes, bare: K critic forward+backward, the reference forward, a policy forward+backward
    and the step-KL forward, over the same batch through the same modules (no optimizer, no metrics)."""
    from liveloop.critic.value_model import token_values

    start = time.perf_counter()
    critic = lane.critic.optimizer.module
    for _ in range(value_steps):
        v = token_values(critic, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)
        v.float().square().mean().backward()
    policy = lane.policy_opt.module
    with torch.inference_mode():
        if lane.adapters is not None:
            with lane.adapters.base() as base:
                base(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                     logits_to_keep=batch.scored_positions)
        elif lane.reference is not None:
            lane.reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                           logits_to_keep=batch.scored_positions)
    keep = {"logits_to_keep": batch.scored_positions}  # the positions the learner's head runs on
    logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **keep).logits
    torch.log_softmax(logits.float(), -1).mean().backward()
    with torch.inference_mode():
        policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **keep)
    seconds = time.perf_counter() - start
    for module in (critic, policy):
        module.zero_grad(set_to_none=True)
    return seconds


def run_arm(name: str, model_dir: Path, rated, args) -> dict:
    from liveloop.config import load_config
    from liveloop.learner.lanes import build_learner
    from liveloop.rl.batch import Sample, make_batch

    cfg = load_config("default")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        adapters, learner_keys, critic_keys = ARMS[name]
        store = fill_store(tmp, model_dir, rated, "shared" if adapters == "shared" else None)
        learner_cfg = dataclasses.replace(cfg.learner, checkpoint_dir=str(tmp / "versions"), publish_every_steps=10**6,
                                          publish_every_seconds=1e9, max_batch_size=1, **learner_keys)
        critic_cfg = dataclasses.replace(cfg.critic, **critic_keys)
        gc.collect()
        before = rss_gib()
        learner = build_learner(
            learner_cfg, critic_cfg, model_dir, segments=dataclasses.replace(cfg.segments, adapters=adapters),
            feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
        )
        built = rss_gib()
        lane = learner if not hasattr(learner, "lanes") else next(iter(learner.lanes.values()))
        step = lane.step
        learner_s, floor_s = [], []
        with whole_logits(name.endswith("_whole_logits")):
            reset_peak()
            step()  # the first step: its KL and verdict; warm-up for the timings
            first = dict(lane.state.last_metrics)
            for i in range(1, len(rated)):
                t = time.perf_counter()
                if not step():
                    break
                learner_s.append(time.perf_counter() - t)
                prompt, reply, lps = (np.asarray(x) for x in rated[i])
                host = make_batch([Sample(prompt, reply, lps.astype(np.float32), np.ones(len(reply), np.int8), 1.0, 0)])
                floor_s.append(floor_seconds(lane, lane.place.batch(host), cfg.critic.value_steps))
            peak = peak_gib()
        after = rss_gib()
        owners = tensor_bytes(learner)
        result = {
            "arm": name, "adapters": adapters, "learner": learner_keys, "critic": critic_keys,
            "rss_gib": {"before": round(before, 2), "built": round(built, 2), "peak_in_steps": round(peak, 2), "after_steps": round(after, 2)},
            "prompt_tokens": [len(p) for p, _, _ in rated],
            "tensors_gib": owners, "tensors_total_gib": round(sum(owners.values()), 3),
            "first_step": {k: first.get(k) for k in ("learner/step_kl", "learner/rejected_steps", "learner/cut_steps", "learner/lr")},
            "seconds_per_rating": learner_s, "floor_seconds": floor_s,
            "median_seconds": sorted(learner_s)[len(learner_s) // 2] if learner_s else None,
            "median_floor": sorted(floor_s)[len(floor_s) // 2] if floor_s else None,
        }
        if result["median_seconds"] and result["median_floor"]:
            result["vs_floor"] = round(result["median_seconds"] / result["median_floor"], 3)
        store.close()
        del learner, lane, step
        gc.collect()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--arms", nargs="+", default=["lora", "lora_mlp_critic", "full"], choices=sorted(ARMS))
    ap.add_argument("--ratings", type=int, default=6)
    ap.add_argument("--length", type=int, default=100)
    ap.add_argument("--prompt-words", type=int, default=0, help="words of notes before each question (a long prompt)")
    ap.add_argument("--out", default="learner_real", help="result name under bench/results/")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model_dir = Path(args.model)
    rated = replies(model_dir, args.ratings, args.length, prompt_words=args.prompt_words)
    results = []
    for arm in args.arms:
        r = run_arm(arm, model_dir, rated, args)
        results.append(r)
        print(f"{arm}: rss {r['rss_gib']}  tensors {r['tensors_total_gib']} GiB  first step {r['first_step']}  "
              f"s/rating {r['median_seconds']:.2f} floor {r['median_floor']:.2f} (x{r.get('vs_floor')})", flush=True)
        for owner, gib in r["tensors_gib"].items():
            print(f"    {owner:34s} {gib:7.3f} GiB")
    save(args.out, {"model": str(model_dir), "ratings": args.ratings, "length": args.length, "prompt_words": args.prompt_words,
                    "arms": results}, model_dir)


if __name__ == "__main__":
    main()
