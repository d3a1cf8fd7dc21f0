"""Peak memory and time of ONE training step, BGPO vs VRPO-OL, for n_t in {1, 2, 4, 8, 16, 32}.

Each (loss, n_t) runs in a fresh subprocess on the same model (a seeded ModernBERT masked LM, wider than
the tiny default so activations dominate) and the same batch (one group of G responses of L tokens).
The step: masks drawn, old-policy ELBO terms under no_grad, then the loss's backward: BGPO one Monte-Carlo
sample's graph at a time, VRPO-OL all n_t graphs in one. Peak memory: on CUDA torch.cuda.max_memory_allocated
over the step; on CPU the rise of the process's peak RSS (ru_maxrss) above its RSS just before the step.
On CPU the workers run with glibc's MALLOC_MMAP_THRESHOLD_=65536 and MALLOC_TRIM_THRESHOLD_=0: every
tensor of 64 KiB or more is its own mapping, returned to the system when freed, so the peak RSS follows
the peak of live memory instead of what the allocator kept from earlier frees (without them the CPU
figures wander by tens of MB between runs).

    python bench/bgpo_memory.py [--hidden 128] [--length 128] [--group 8] [--nts 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def worker(loss: str, n_t: int, hidden: int, length: int, group: int, device: str) -> dict:
    import torch

    from liveloop.diffusion.elbo import draw_masks, elbo_terms, sample_elbo
    from liveloop.diffusion.losses import bgpo_sample_loss, vrpo_ol_loss
    from liveloop.diffusion.model import TinyModelConfig, tiny_model
    from liveloop.diffusion.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = tiny_model(TinyModelConfig(hidden_size=hidden, num_layers=4, num_heads=4, intermediate_size=2 * hidden,
                                       max_position_embeddings=1024), tok, seed=0).to(device).train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([tok.encode("countdown 3 5 7 = 22\n", add_special_tokens=False)] * group).to(device)
    responses = torch.randint(6, len(tok), (group, length), generator=gen).to(device)
    adv = torch.linspace(-1, 1, group).to(device)
    draw = draw_masks(group, length, n_t, gen)
    draw = type(draw)(draw.masks.to(device), draw.counts.to(device))
    with torch.no_grad():
        old = elbo_terms(model, prompt, responses, draw)
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    start = time.perf_counter()
    if loss == "bgpo":
        for j in range(n_t):
            lj = sample_elbo(model, prompt, responses, draw.masks[:, j], draw.counts[:, j])
            bgpo_sample_loss(lj, old[:, j], adv, n_t, clip_eps=0.2, dual_clip=3.0)[0].backward()
    else:
        vrpo_ol_loss(elbo_terms(model, prompt, responses, draw), old, adv, clip_eps=0.2, dual_clip=3.0)[0].backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    total = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if device == "cpu" else None
    return {"loss": loss, "n_t": n_t, "peak_mb": peak / 2**20, "step_seconds": time.perf_counter() - start,
            "process_peak_mb": total, "device": device}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--length", type=int, default=128, help="response tokens L")
    p.add_argument("--group", type=int, default=8, help="responses G in the batch")
    p.add_argument("--nts", default="1,2,4,8,16,32")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--worker", nargs=2, metavar=("LOSS", "NT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.hidden, args.length, args.group, device)))
        return
    rows = []
    for n_t in [int(x) for x in args.nts.split(",")]:
        for loss in ("bgpo", "vrpo_ol"):
            cmd = [sys.executable, __file__, "--worker", loss, str(n_t), "--hidden", str(args.hidden),
                   "--length", str(args.length), "--group", str(args.group), "--device", device]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    table = []
    print(f"\n{'n_t':>4} {'BGPO MB':>9} {'VRPO-OL MB':>11} {'VRPO/BGPO':>10} {'BGPO s':>8} {'VRPO s':>8}")
    for n_t in sorted({r["n_t"] for r in rows}):
        b = next(r for r in rows if r["n_t"] == n_t and r["loss"] == "bgpo")
        v = next(r for r in rows if r["n_t"] == n_t and r["loss"] == "vrpo_ol")
        ratio = v["peak_mb"] / max(b["peak_mb"], 1e-9)
        table.append({"n_t": n_t, "bgpo_peak_mb": b["peak_mb"], "vrpo_ol_peak_mb": v["peak_mb"],
                      "memory_ratio_vrpo_over_bgpo": ratio, "bgpo_step_s": b["step_seconds"],
                      "vrpo_ol_step_s": v["step_seconds"]})
        print(f"{n_t:>4} {b['peak_mb']:>9.1f} {v['peak_mb']:>11.1f} {ratio:>10.2f} {b['step_seconds']:>8.2f} "
              f"{v['step_seconds']:>8.2f}")
    from common import save

    path = save("bgpo_memory", {"device": device, "hidden": args.hidden, "length": args.length,
                                "group": args.group, "rows": table})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
