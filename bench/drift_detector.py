"""The change detectors' detection delay and false-alarm rate on seeded synthetic thumbs streams.

    python bench/drift_detector.py [--seeds 200]

For each detector (the default config and a few thresholds): streams of 0/1 ratings whose thumbs-up
rate shifts once (0.8 -> 0.4, 0.7 -> 0.5, 0.3 -> 0.7, after 600 ratings): ratings from the shift to
the first alarm after it (median, p90; "missed" if none within 1,000); and stationary streams of
5,000 ratings at rates 0.2, 0.5, 0.8: false alarms per 1,000 ratings.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, save  # noqa: E402

from liveloop.monitor.config import MonitorConfig  # noqa: E402
from liveloop.monitor.detector import make_detector  # noqa: E402

SHIFTS = [(0.8, 0.4), (0.7, 0.5), (0.3, 0.7)]
CONFIGS = {
    "page-hinkley (default: delta 0.05, h 25)": MonitorConfig(),
    "page-hinkley (delta 0.05, h 15)": MonitorConfig(threshold=15.0),
    "page-hinkley (delta 0.05, h 40)": MonitorConfig(threshold=40.0),
    "cusum (delta 0.05, h 25, warm-up 200)": MonitorConfig(detector="cusum", threshold=25.0, warmup=200),
    "cusum (delta 0.05, h 40, warm-up 200)": MonitorConfig(detector="cusum", threshold=40.0, warmup=200),
}


def alarms(config: MonitorConfig, xs: list[float]) -> list[int]:
    d = make_detector(config)
    return [a.index for x in xs if (a := d.update(x))]


def stream(rng: random.Random, parts: list[tuple[float, int]]) -> list[float]:
    return [1.0 if rng.random() < p else 0.0 for p, n in parts for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=200)
    args = ap.parse_args()
    result: dict = {"seeds": args.seeds, "configs": {}}
    print(f"{'detector':<44} {'shift':>10} {'median':>7} {'p90':>5} {'missed':>7} | false alarms / 1k ratings")
    for name, config in CONFIGS.items():
        row: dict = {"shifts": {}}
        fa = events = 0
        for seed in range(args.seeds):
            for p in (0.2, 0.5, 0.8):
                xs = stream(random.Random(10_000 + seed), [(p, 5000)])
                fa += len(alarms(config, xs))
                events += len(xs)
        row["false_alarms_per_1k"] = fa / events * 1000
        for before, after in SHIFTS:
            delays, missed = [], 0
            for seed in range(args.seeds):
                found = [i - 600 for i in alarms(config, stream(random.Random(seed), [(before, 600), (after, 1000)])) if i > 600]
                if found:
                    delays.append(found[0])
                else:
                    missed += 1
            key = f"{before}->{after}"
            row["shifts"][key] = {"median": percentile(delays, 50), "p90": percentile(delays, 90), "missed": missed}
            print(f"{name:<44} {key:>10} {percentile(delays, 50):>7.0f} {percentile(delays, 90):>5.0f} {missed:>7} | {row['false_alarms_per_1k']:.4f}")
        result["configs"][name] = row
    print("saved", save("drift_detector", result))


if __name__ == "__main__":
    main()
