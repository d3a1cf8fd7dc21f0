"""Colluding keys: how far 1, 2, 5 or 10 keys that invert the honest users' taste together move the
policy, at 2%, 5% and 50% of all ratings, under the shipped defences (influence caps,
learner/influence.py; quarantine by corroborated disagreement score, monitor/poisoning.py), and how
many honest keys the quarantine takes wrongly.

    python bench/collusion.py [--quick] [--honest-keys 64] [--ratings-per-key 6] [--seeds 0]

The world is bench/poisoning.py's `World` (its prompts, target token, learning rule and fixed draws):
the real `OnlineLearner` (sliding-window method, the shipped learning rule) on the tiny model over a real
SQLite store, one-token replies, honest keys rating up exactly the target token in rounds. Here the
attack is `colluders` keys that rate their own replies inverted, taking turns, `share` of all ratings
from the first rating on. The server's loop is replayed every `check_every` ratings: the keys that
`find_suspects` takes (`[monitor]` quarantine_z, quarantine_min_ratings, quarantine_corroborating_keys,
similarity) are quarantined.

Per cell: `movement` = the attacked run's `p_end` minus the no-attack run's (the target's probability,
mean over the last quarter of policy steps; negative: the attack pulled honest users' reward down),
`honest_quarantined` (honest keys quarantined during the run), `colluders_quarantined`, and
`honest_flagged_by_old_rule` (honest keys that the rule before this change, exact copies only and no
corroboration, would flag on the run's final ratings). `--undefended` adds the movement with no caps
and no quarantine. `--quick` is a small grid (32 honest keys, 4 rounds, 1, 2 and 10 colluders at 5% and
50%) that finishes in a few minutes on one core.

Writes bench/results/collusion.json (or collusion_quick.json).

`--framing` measures the other attack, on the quarantine rule alone (no learner: a real SQLite store and
`find_suspects` as the server calls it): 1 to 10 colluders ask the prompts an honest target asks and rate
their similar replies inverted (`framed` prompts nobody else asks), while `honest_keys` honest keys, the
target, the colluders and one real poisoner (who inverts its own ratings) share `shared` prompts; the
colluders either invert those too ("loud") or rate them honestly ("quiet", to hide). Per rule
(`quarantine_corroborating_keys` 3, the old default, and 11, the shipped one): whether the target was
quarantined, whether the poisoner was, how many colluders. Writes bench/results/collusion_framing.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _poisoning():
    sys.path.insert(0, str(HERE))
    import poisoning  # bench/poisoning.py: the world

    return poisoning


@dataclass(frozen=True)
class Cell:
    colluders: int  # 0: no attack
    share: float  # the colluders' share of all ratings
    defended: bool = True
    honest_keys: int = 64
    ratings_per_key: int = 6
    quarantine_z: float = 3.0
    quarantine_min_ratings: int = 30
    corroborating_keys: int = 11  # [monitor] quarantine_corroborating_keys, as shipped
    check_every: int = 8
    learner: str = "default"
    batch_size: int = 8
    window: int = 32
    seed: int = 0


@dataclass
class CellResult:
    cell: Cell
    p_before: float
    p_trace: list[float] = field(default_factory=list)
    honest_ratings: int = 0
    colluder_ratings: int = 0
    trained: int = 0
    capped: int = 0
    honest_quarantined: list[str] = field(default_factory=list)
    colluders_quarantined: list[str] = field(default_factory=list)
    honest_flagged_by_old_rule: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def p_end(self) -> float:
        tail = self.p_trace[-max(1, len(self.p_trace) // 4):] or [self.p_before]
        return sum(tail) / len(tail)

    def as_dict(self) -> dict:
        return asdict(self) | {"p_end": self.p_end}


def colluder(i: int) -> str:
    return f"colluder-{i:02d}"


def schedule(c: Cell) -> list[tuple[str, int]]:
    """(key, draw index) in arrival order: honest rounds (the same draws as bench/poisoning.py's); after
    each honest rating the colluders, in turn, rate until they hold `share` of all ratings so far.
    Colluders' draws are negative (their own stream)."""
    events: list[tuple[str, int]] = []
    honest = mine = 0
    for rnd in range(c.ratings_per_key):
        for k in range(c.honest_keys):
            events.append((f"honest-{k:03d}", rnd * c.honest_keys + k))
            honest += 1
            while c.colluders and mine < int(c.share / (1 - c.share) * honest):
                events.append((colluder(mine % c.colluders), -(mine + 1)))
                mine += 1
    return events


def run_cell(c: Cell, workdir: Path, model_dir: Path) -> CellResult:
    from liveloop.monitor.poisoning import EXACT, Similarity, disagreement_scores, find_suspects, suspects

    poisoning = _poisoning()
    started = time.perf_counter()
    config = poisoning.world_config(c.learner, workdir, c.seed, c.batch_size, c.window, c.defended, c.ratings_per_key)
    world = poisoning.World(workdir, model_dir, config, c.seed)
    store, learner = world.store, world.learner

    def quarantine_check() -> None:
        _, found = find_suspects(store.keys.key_ratings(20000), c.quarantine_z, c.quarantine_min_ratings, c.corroborating_keys,
                                 exclude_from_consensus=store.keys.quarantined_keys(), similarity=Similarity())
        for s in found:
            store.keys.set_quarantined(s.score.key_id, True, f"disagreement z={s.score.z:.1f}; {s.corroborated.z:.1f} corroborated")

    result = CellResult(c, world.p_target())
    events = schedule(c)
    for i, (key, draw) in enumerate(events):
        world.serve(i, key, draw, (lambda hit: int(not hit)) if key.startswith("colluder") else int)
        if c.defended and (i + 1) % c.check_every == 0:
            quarantine_check()
        result.p_trace += world.train()
    if c.defended:
        quarantine_check()
    quarantined = store.keys.quarantined_keys()
    old = suspects(disagreement_scores(store.keys.key_ratings(20000), similarity=EXACT), c.quarantine_z, c.quarantine_min_ratings)
    result.honest_ratings = sum(1 for k, _ in events if k.startswith("honest"))
    result.colluder_ratings = len(events) - result.honest_ratings
    result.trained = learner.state.samples
    result.capped = int(learner.method.stats().get("learner/capped_ratings", 0))
    result.honest_quarantined = sorted(k for k in quarantined if k.startswith("honest"))
    result.colluders_quarantined = sorted(k for k in quarantined if k.startswith("colluder"))
    result.honest_flagged_by_old_rule = sorted(d.key_id for d in old if d.key_id.startswith("honest"))
    result.seconds = time.perf_counter() - started
    store.close()
    return result


@dataclass(frozen=True)
class Framing:
    colluders: int
    loud: bool  # the colluders invert the shared prompts too
    corroborating_keys: int
    honest_keys: int = 24
    framed: int = 90
    shared: int = 30
    seed: int = 0


def run_framing(f: Framing, workdir: Path) -> dict:
    """One framing cell: who the rule quarantines (see the module docstring)."""
    import random

    from liveloop.monitor.config import MonitorConfig
    from liveloop.monitor.poisoning import Similarity, find_suspects
    from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

    rng = random.Random(f.seed)
    store = Store(StoreConfig(url=f"sqlite:///{workdir}/store.db"))
    store.migrate()
    store.versions.ensure_base_version("/models/base")  # the responses name version 0
    target, poisoner = "target", "poisoner"
    colluders = [colluder(i) for i in range(f.colluders)]
    honest = [f"honest-{k:03d}" for k in range(f.honest_keys)]
    reply = tuple(range(100, 112))
    rows: list[tuple[str, str, tuple[int, ...], int]] = []
    for p in range(f.framed):
        good = rng.random() < 0.5
        rows += [(f"f{p}-{k}", k, (1, p), int(good if k == target else not good)) for k in [target] + colluders]
    for p in range(f.shared):
        good = rng.random() < 0.5
        for k in honest + [target, poisoner] + colluders:
            inverted = k == poisoner or (k in colluders and f.loud)
            rows.append((f"s{p}-{k}", k, (2, p), int(good != inverted)))
    store.feedback.write_batch([ResponseRecord(rid, k, "m", 0, "chat", prompt, reply, (-1.0,) * len(reply), "stop", 1.0, 1.0, 1.0)
                       for rid, k, prompt, _ in rows])
    store.feedback.write_batch([FeedbackRecord(rid, k, reward) for rid, k, _, reward in rows])
    m = MonitorConfig()  # the shipped similarity; z and min ratings as configs/serve/default.toml ships them (4.0, 30)
    _, found = find_suspects(store.keys.key_ratings(100000), 4.0, 30, f.corroborating_keys,
                             similarity=Similarity(m.similar_reply_jaccard, m.similar_reply_shingle))
    taken = {s.score.key_id for s in found}
    store.close()
    return asdict(f) | {
        "target_quarantined": target in taken, "poisoner_quarantined": poisoner in taken,
        "colluders_quarantined": len(taken & set(colluders)), "honest_quarantined": len(taken & set(honest)),
    }


def framing_main(seeds: list[int]) -> None:
    import tempfile

    sys.path.insert(0, str(HERE))
    from common import save

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for n in (1, 2, 3, 5, 10):
                for loud in (True, False):
                    for rule in (3, 11):
                        work = Path(tmp) / f"{seed}-{n}-{loud}-{rule}"
                        work.mkdir()
                        row = run_framing(Framing(n, loud, rule, seed=seed), work)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    print("| colluders | colluders on shared prompts | rule (corroborating keys) | target framed | poisoner taken | colluders taken | honest taken |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['colluders']} | {'inverted' if r['loud'] else 'honest'} | {r['corroborating_keys']} | {r['target_quarantined']} "
              f"| {r['poisoner_quarantined']} | {r['colluders_quarantined']}/{r['colluders']} | {r['honest_quarantined']} |")
    print(f"wrote {save('collusion_framing', {'seeds': seeds, 'rows': rows})}")


GRID = {"colluders": [1, 2, 5, 10], "shares": [0.02, 0.05, 0.5]}
QUICK = {"colluders": [1, 2, 10], "shares": [0.05, 0.5], "honest_keys": 32, "ratings_per_key": 4}


def table(rows: list[dict]) -> str:
    head = "| colluders | share | movement (defended) | movement (undefended) | colluders quarantined | honest keys wrongly quarantined | honest flagged by the old rule | seconds |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        und = f"{r['undefended_movement']:+.3f}" if r.get("undefended_movement") is not None else "-"
        lines.append(
            f"| {r['colluders']} | {r['share']:.0%} | {r['movement']:+.3f} | {und} | {r['colluders_quarantined']}/{r['colluders']} "
            f"| {r['honest_quarantined']} | {r['honest_flagged_by_old_rule']} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    import tempfile

    import torch

    sys.path.insert(0, str(HERE))
    from common import default_model, save

    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small grid (32 honest keys, 4 rounds, 1/2/10 colluders at 5%%/50%%)")
    ap.add_argument("--honest-keys", type=int, default=64)
    ap.add_argument("--ratings-per-key", type=int, default=6)
    ap.add_argument("--colluders", type=int, nargs="+", help="colluding key counts (default 1 2 5 10)")
    ap.add_argument("--shares", type=float, nargs="+", help="the colluders' share of ratings (default 0.02 0.05 0.5)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--undefended", action="store_true", help="also run every cell without caps and quarantine")
    ap.add_argument("--model", type=Path, help="a model directory (default: the default model)")
    ap.add_argument("--framing", action="store_true", help="colluders framing an honest key, against the quarantine rule alone")
    args = ap.parse_args()
    if args.framing:
        return framing_main(args.seeds)
    grid = QUICK if args.quick else GRID
    honest_keys = grid.get("honest_keys", args.honest_keys) if args.quick else args.honest_keys
    rounds = grid.get("ratings_per_key", args.ratings_per_key) if args.quick else args.ratings_per_key
    colluders, shares = args.colluders or grid["colluders"], args.shares or grid["shares"]
    model_dir = args.model or default_model()
    base = dict(honest_keys=honest_keys, ratings_per_key=rounds)
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            clean = run_cell(Cell(0, 0.0, seed=seed, **base), Path(tmp) / f"s{seed}-clean", model_dir)
            runs.append(clean.as_dict())
            print(json.dumps({"seed": seed, "no_attack_p_end": clean.p_end, "honest_quarantined": len(clean.honest_quarantined)}), flush=True)
            for n in colluders:
                for share in shares:
                    r = run_cell(Cell(n, share, seed=seed, **base), Path(tmp) / f"s{seed}-{n}-{share}", model_dir)
                    und = run_cell(Cell(n, share, defended=False, seed=seed, **base), Path(tmp) / f"s{seed}-{n}-{share}-u", model_dir) if args.undefended else None
                    runs += [r.as_dict()] + ([und.as_dict()] if und else [])
                    row = {
                        "seed": seed, "colluders": n, "share": share, "movement": r.p_end - clean.p_end,
                        "undefended_movement": und.p_end - clean.p_end if und else None,
                        "colluders_quarantined": len(r.colluders_quarantined), "honest_quarantined": len(r.honest_quarantined),
                        "honest_flagged_by_old_rule": len(r.honest_flagged_by_old_rule), "seconds": r.seconds + (und.seconds if und else 0.0),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary = {"quick": args.quick, "honest_keys": honest_keys, "ratings_per_key": rounds, "seeds": args.seeds, "rows": rows, "runs": runs}
    path = save("collusion_quick" if args.quick else "collusion", summary, model_dir=model_dir)
    print(table(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
