"""Critic grad norm with and without frozen attention: two critics from the same initial weights
fitted on the same stream of rated samples (K value steps each), side by side in one run.

    .venv/bin/python bench/critic_grad_norm.py [--samples 160] [--k 2]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from common import default_model, percentile, rated_samples, save  # noqa: E402


def main() -> None:
    from liveloop.critic.config import CriticConfig
    from liveloop.critic.trainer import Critic
    from liveloop.critic.value_model import build_value_model
    from liveloop.rl.advantages import gae_skip_observations
    from liveloop.rl.batch import make_batch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = default_model()
    samples = rated_samples(model_dir, args.samples)
    critics = {}
    for frozen in (True, False):
        torch.manual_seed(0)  # the same value-head initialisation for both
        critics[frozen] = Critic(build_value_model(model_dir), CriticConfig(value_steps=args.k, learning_rate=args.lr, freeze_attention=frozen))
    norms = {True: [], False: []}
    ev = {True: [], False: []}
    for s in samples:  # one rated response at a time, as online
        batch = make_batch([s])
        for frozen, critic in critics.items():
            values = critic.values(batch)
            _, returns = gae_skip_observations(values[0], s.reward, batch.action_mask[0], 1.0, 1.0)
            m = critic.update(batch, returns[None])
            norms[frozen].append(m["critic/grad_norm"])
            ev[frozen].append(m["critic/value_loss"])
    rows = {}
    for frozen in (True, False):
        n = norms[frozen]
        rows["frozen" if frozen else "full"] = {
            "grad_norm_mean": statistics.mean(n),
            "grad_norm_p99": percentile(n, 99),
            "grad_norm_max": max(n),
            "value_loss_last50": statistics.mean(ev[frozen][-50:]),
            "trainable_params": sum(p.numel() for p in critics[frozen].trainable),
        }
    print(f"{args.samples} rated samples (reward rate {sum(s.reward for s in samples) / len(samples):.2f}), K={args.k}")
    print("| critic | trainable params | grad norm mean | p99 | max | value loss (last 50) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} attention | {r['trainable_params']:,} | {r['grad_norm_mean']:.3f} | {r['grad_norm_p99']:.3f} | {r['grad_norm_max']:.3f} | {r['value_loss_last50']:.4f} |")
    f, u = rows["frozen"], rows["full"]
    print(f"ratio frozen/full: grad norm mean {f['grad_norm_mean'] / u['grad_norm_mean']:.2f}, max {f['grad_norm_max'] / u['grad_norm_max']:.2f}")
    print(f"saved {save('critic_grad_norm', {'config': vars(args), 'rows': rows, 'norms': {str(k): v for k, v in norms.items()}})}")


if __name__ == "__main__":
    main()
