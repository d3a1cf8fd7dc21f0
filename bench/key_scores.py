"""Key scores over a sliding window: what the monitor pays every few polls to score every key against the
others' consensus (`find_suspects` over the newest 20,000 ratings), grouping the window's replies afresh
against remembering each reply's group between scorings (`ReplyGroups`), side by side on the same
synthetic ratings (near-copies of a few replies per prompt, as sampling gives).

    .venv/bin/python bench/key_scores.py [--window 20000] [--new 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from common import median, save  # noqa: E402

from liveloop.monitor.poisoning import ReplyGroups, Similarity, find_suspects
from liveloop.store.keys import KeyRating


def ratings(n: int, seed: int = 0, prompts: int = 200, keys: int = 20) -> list[KeyRating]:
    rng = random.Random(seed)
    replies = {f"p{i}": [tuple(rng.randrange(500) for _ in range(rng.randrange(8, 60))) for _ in range(30)] for i in range(prompts)}
    out = []
    for i in range(n):
        p = f"p{rng.randrange(prompts)}"
        tokens = list(rng.choice(replies[p]))
        if rng.random() < 0.5:
            tokens[rng.randrange(len(tokens))] = rng.randrange(500)  # a near-copy
        out.append(KeyRating(i, f"k{rng.randrange(keys)}", f"{p}:{tuple(tokens)}", int(rng.random() < 0.6), p, tuple(tokens)))
    return out


def main() -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, default=20000)
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    similarity = Similarity()
    stream = ratings(args.window + args.new * args.rounds)
    groups = ReplyGroups(similarity)
    find_suspects(stream[: args.window], 4.0, 30, 3, similarity=similarity, groups=groups)  # the first scoring
    fresh, remembered = [], []
    for r in range(1, args.rounds + 1):
        window = stream[r * args.new : r * args.new + args.window]
        t0 = time.perf_counter()
        find_suspects(window, 4.0, 30, 3, similarity=similarity)
        t1 = time.perf_counter()
        find_suspects(window, 4.0, 30, 3, similarity=similarity, groups=groups)
        t2 = time.perf_counter()
        fresh.append(t1 - t0)
        remembered.append(t2 - t1)
    result = {
        "window": args.window, "new_per_scoring": args.new, "rounds": args.rounds,
        "fresh_seconds_median": median(fresh), "remembered_seconds_median": median(remembered),
        "speedup": median(fresh) / median(remembered),
    }
    print(f"window {args.window}, {args.new} new per scoring: fresh {median(fresh):.2f} s, remembered {median(remembered):.2f} s ({result['speedup']:.1f}x)")
    print("saved", save("key_scores", result))


if __name__ == "__main__":
    main()
