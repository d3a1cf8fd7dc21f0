"""Bytes per published version through the `delta` transport, full copy against delta, on the tiny default
model and on an 8B-shaped one.

Tiny model: the learner's update, for real: replies sampled from the model, rated thumbs up and down,
SAO's policy loss (liveloop.rl.losses.sao_policy_loss against the replies' behaviour logprobs), AdamW at
the learner's default learning rate (`LearnerConfig`), `publish_every_steps` steps per version, in the
learner's dtypes (float32 on the CPU; bfloat16 with fp32 master weights on a GPU). Each version goes
through a real DeltaSender (no full copy but the first: `delta_max_chain` large) and a DeltaReceiver
rebuilds it (checked against its digest); the file bytes written are what crosses machines.

8B-shaped: Llama-3-8B's tensor shapes (no weights allocated): each tensor kind's bytes scaled by the
delta/full ratio measured on the tiny model's tensors of that kind (attention q/k/v/o, MLP gate/up/down
from the MoE experts, norms, embedding; the router has no counterpart). Caveats: the tiny model's
embedding has few rows, so every row moves; an 8B model's 128k-row embedding and LM head see most rows
untouched by one batch (their ratio here is an upper bound), and a dense MLP gets a gradient everywhere
where the tiny model's unrouted experts get none.

    .venv/bin/python bench/delta_bytes.py [--versions 6] [--samples 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tempfile
import time
from collections import defaultdict

import torch

from common import default_model, rated_samples, save  # noqa: E402

KINDS = (
    ("embed", r"embed_tokens|lm_head"), ("q", r"q_proj"), ("k", r"k_proj"), ("v", r"v_proj"), ("o", r"o_proj"),
    ("gate_up", r"gate_up_proj"), ("gate", r"gate_proj"), ("up", r"up_proj"), ("down", r"down_proj"), ("router", r"mlp\.gate\.|router"),
    ("norm", r"norm"),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def llama3_8b() -> dict[str, int]:
    """Llama-3-8B's parameter count per tensor kind (untied LM head)."""
    h, inter, layers, vocab, kv = 4096, 14336, 32, 128256, 1024
    return {
        "embed": 2 * vocab * h, "q": layers * h * h, "k": layers * kv * h, "v": layers * kv * h, "o": layers * h * h,
        "gate": layers * inter * h, "up": layers * inter * h, "down": layers * h * inter, "norm": (2 * layers + 1) * h,
    }


def run(model_dir, dtype: torch.dtype, samples, versions: int) -> dict:
    from transformers import AutoModelForCausalLM

    from liveloop.learner.config import LearnerConfig
    from liveloop.rl.batch import make_batch, response_logprobs
    from liveloop.rl.losses import sao_policy_loss
    from liveloop.rl.optim import make_optimizer
    from liveloop.transport.base import byte_view
    from liveloop.transport.delta import DeltaReceiver, DeltaSender, encode

    cfg = LearnerConfig()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    opt = make_optimizer(model, cfg.learning_rate, cfg.max_grad_norm)
    batch = make_batch(samples)
    advantages = (batch.rewards - batch.rewards.mean())[:, None].expand_as(batch.action_mask)
    rows = []
    per_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # delta bytes, full bytes, changed elems, elems
    with tempfile.TemporaryDirectory() as tmp:
        sender, receiver = DeltaSender(tmp, max_chain=10_000), DeltaReceiver(tmp)
        prev = None
        for version in range(1, versions + 1):
            if version > 1:
                for _ in range(cfg.publish_every_steps):
                    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                    logp = response_logprobs(logits, batch)
                    loss, _ = sao_policy_loss(logp, batch.behavior_logprobs, advantages, batch.action_mask, cfg.eps_low, cfg.eps_high)
                    opt.step(loss)
            state = model.state_dict()
            start = time.perf_counter()
            sender.start_update(version)
            sender.send(state)
            handle = sender.finish()
            send_s = time.perf_counter() - start
            start = time.perf_counter()
            rebuilt = receiver.tensors(handle)
            rebuild_s = time.perf_counter() - start
            assert all(torch.equal(byte_view(rebuilt[k]), byte_view(v)) for k, v in state.items())
            now = {k: byte_view(v).clone() for k, v in state.items()}
            if prev is not None:
                seen = set()
                for name, t in now.items():
                    ptr = state[name].data_ptr()
                    if ptr in seen:  # tied: written once
                        continue
                    seen.add(ptr)
                    size = state[name].element_size()
                    changed = int((prev[name].view(-1, size) != t.view(-1, size)).any(1).sum())
                    if changed:
                        parts = encode(prev[name], t, size, sender.chunk_bytes)
                        sent = sum(p.numel() * p.element_size() for p in parts.values())
                    else:
                        sent = 0
                    k = per_kind[kind_of(name)]
                    k[0] += sent
                    k[1] += t.numel()
                    k[2] += changed
                    k[3] += t.numel() // size
            prev = now
            rows.append({
                "version": version, "kind": handle.detail["kind"], "bytes": handle.detail["bytes"],
                "full_bytes": handle.detail["full_bytes"], "send_s": round(send_s, 4), "rebuild_s": round(rebuild_s, 4),
            })
    kinds = {k: {"ratio": v[0] / v[1], "changed_elements": v[2] / v[3]} for k, v in per_kind.items()}
    return {"dtype": str(dtype).removeprefix("torch."), "learning_rate": cfg.learning_rate, "steps_per_version": cfg.publish_every_steps,
            "versions": rows, "kinds": kinds}


def scaled_8b(kinds: dict[str, dict], element_size: int) -> dict:
    shapes = llama3_8b()
    full = sum(shapes.values()) * element_size
    # the MoE experts' fused gate_up tensor (transformers >= 5) stands for a dense gate and up
    delta = sum(n * element_size * (kinds.get(k) or kinds["gate_up"])["ratio"] for k, n in shapes.items())
    return {"full_bytes": full, "delta_bytes": int(delta), "ratio": delta / full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8, help="rated replies in the batch each step trains on")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = default_model()
    # thumbs up and down, half each (the target word of `rated_samples` rarely appears in the tiny model's replies)
    samples = [dataclasses.replace(s, reward=float(i % 2)) for i, s in enumerate(rated_samples(model_dir, args.samples))]
    result = {"versions": args.versions, "samples": args.samples, "runs": []}
    print(f"{'dtype':9} {'version':>7} {'kind':>5} {'full B':>10} {'sent B':>10} {'sent/full':>9} {'send s':>7} {'rebuild s':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        r = run(model_dir, dtype, samples, args.versions)
        for row in r["versions"]:
            print(f"{r['dtype']:9} {row['version']:7d} {row['kind']:>5} {row['full_bytes']:10d} {row['bytes']:10d} "
                  f"{row['bytes'] / row['full_bytes']:9.3f} {row['send_s']:7.3f} {row['rebuild_s']:9.3f}")
        deltas = [row for row in r["versions"] if row["kind"] == "delta"]
        r["mean_delta_ratio"] = sum(row["bytes"] / row["full_bytes"] for row in deltas) / max(1, len(deltas))
        r["llama3_8b"] = scaled_8b(r["kinds"], 4 if r["dtype"] == "float32" else 2)
        result["runs"].append(r)
    print(f"\n{'dtype':9} {'tensor kind':>11} {'changed elems':>13} {'delta/full':>10}")
    for r in result["runs"]:
        for kind, v in sorted(r["kinds"].items()):
            print(f"{r['dtype']:9} {kind:>11} {v['changed_elements']:13.3f} {v['ratio']:10.3f}")
    print(f"\n{'dtype':9} {'model':>10} {'full GB/version':>15} {'delta GB/version':>16} {'delta/full':>10}")
    for r in result["runs"]:
        tiny_full = r["versions"][0]["full_bytes"]
        print(f"{r['dtype']:9} {'tiny':>10} {tiny_full / 1e9:15.4f} {tiny_full * r['mean_delta_ratio'] / 1e9:16.4f} {r['mean_delta_ratio']:10.3f}")
        b = r["llama3_8b"]
        print(f"{r['dtype']:9} {'llama3-8b':>10} {b['full_bytes'] / 1e9:15.2f} {b['delta_bytes'] / 1e9:16.2f} {b['ratio']:10.3f}")
    print(f"wrote {save('delta_bytes', result, model_dir)}")


if __name__ == "__main__":
    main()
