"""The policy step across N ranks (`[learner] ranks = N`): DeepSpeed ZeRO stage 1-3, data parallel, on
one machine's CPU cores (gloo).

    group = RankGroup.start(config)                      # this process becomes rank 0; ranks 1..N-1 spawn
    opt = group.optimizer(policy, policy_dir, lr)        # every rank loads policy_dir into its ZeRO engine
    norm, metrics = opt.train(batch, advantages, staleness, ref, kl_coef)   # one policy step, all ranks
    with opt.full_parameters() as model: ...             # rank 0: full weights (ZeRO-3 gathers them)
    group.close()

Rank 0 is the learner's own process, the coordinator: it reads the ratings, runs the critic (plain AdamW
there) and the KL reference, computes the advantages, and owns publishing. Each policy step it cuts the
batch into N contiguous shares of rows, sends shares 1..N-1 to the workers, and every rank runs
`train_share` on its own share: the policy objective (learner/objective.py), backward, ZeRO's reduction
and step, and the step's KL on its share. A rank's loss is scaled by N * (its action tokens / the
batch's), so DeepSpeed's gradient average is exactly the gradient of the whole batch's token mean: the
N-rank step equals the one-rank step on the same batch (tests/integration/learner/test_zero_ranks.py).
Metrics are token-weighted means over the ranks (maxima for `*_max` keys), the same on every rank.

Workers are torch.multiprocessing (spawn) children of rank 0 (`RankGroup` says why not Ray actors nor
the DeepSpeed launcher); orders travel over a pipe per worker, only DeepSpeed's collectives use gloo, on
loopback, and the ranks meet through a file store in a private directory. A worker never outlives rank
0; a worker that dies ends rank 0's next collective with an error (or `RankFailed` before it): the
learner crashes and its supervisor starts a fresh one, with a fresh group.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from liveloop.learner.config import LearnerConfig
from liveloop.learner.objective import policy_objective
from liveloop.learner.placement import placement
from liveloop.rl.batch import TokenBatch, policy_log_dists
from liveloop.rl.diagnostics import token_entropy, token_kl
from liveloop.rl.optim import ZeroOptimizer, extensions_dir
from liveloop.temp_dirs import owned_temp_dir

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # one collective of a step, never the wait between steps


class RankFailed(RuntimeError):
    """A worker rank is gone (it died, or never joined the group): the step cannot run."""


# -- orders from rank 0 to a worker ----------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """Load `policy_dir` and build this rank's ZeRO engine on it (at start and after a reload)."""

    policy_dir: str
    config: LearnerConfig
    lr: float


@dataclass(frozen=True)
class Step:
    """Train on this share of the batch; `weight` = world * share's action tokens / batch's."""

    batch: TokenBatch
    advantages: torch.Tensor
    staleness: torch.Tensor
    ref: torch.Tensor | None
    kl_coef: float
    weight: float


@dataclass(frozen=True)
class SetLr:
    lr: float


@dataclass(frozen=True)
class Gather:
    """Join ZeRO-3's gathering of the full parameters (rank 0 reads them to publish)."""


@dataclass(frozen=True)
class Stop:
    pass


# -- what every rank runs --------------------------------------------------------------------------
def micro_batch(config: LearnerConfig, world: int) -> int:
    """A rank's share of a B-rating batch, rounded up (DeepSpeed's per-rank micro-batch size)."""
    return math.ceil(config.largest_batch / world)


def train_share(opt: ZeroOptimizer, method: Any, config: LearnerConfig, order: Step, world: int) -> tuple[float | None, dict[str, float]]:
    """One policy step on this rank's share; every rank of the group calls it at once. Returns the
    global gradient norm (None: a loss or gradient somewhere was not finite, no rank updated) and the
    metrics reduced over the ranks."""
    import torch.distributed as dist

    batch = order.batch
    opt.model.train()
    loss, dists, metrics = policy_objective(
        opt.module, method, config.kl_estimator, order.kl_coef, batch, order.advantages, order.staleness, order.ref
    )
    metrics["learner/entropy"] = token_entropy(dists.detach(), batch.action_mask)
    finite = torch.tensor([1.0 if bool(torch.isfinite(loss)) else 0.0])
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # one rank's non-finite loss skips the step on all
    norm = opt.step(loss * order.weight) if finite.item() == 1.0 else None
    if norm is not None:
        with torch.no_grad():
            after = policy_log_dists(opt.module, batch)
        metrics["learner/step_kl"] = token_kl(dists.detach(), after, batch.action_mask)
    return norm, reduce_metrics(metrics, order.weight / world)


def reduce_metrics(metrics: dict[str, float], share: float) -> dict[str, float]:
    """Token-weighted means over the ranks (`share`: this rank's fraction of the batch's action
    tokens), maxima for `*_max` keys; every rank passes the same keys."""
    import torch.distributed as dist

    keys = sorted(metrics)
    means = [k for k in keys if not k.endswith("_max")]
    maxima = [k for k in keys if k.endswith("_max")]
    out: dict[str, float] = {}
    for names, op, scale in ((means, dist.ReduceOp.SUM, share), (maxima, dist.ReduceOp.MAX, 1.0)):
        if names:
            t = torch.tensor([metrics[k] * scale for k in names], dtype=torch.float64)
            dist.all_reduce(t, op=op)
            out |= dict(zip(names, t.tolist()))
    return out


def split(batch: TokenBatch, world: int) -> list[tuple[slice, TokenBatch]]:
    """N contiguous shares of the batch's rows (sizes differ by at most one), each a TokenBatch."""
    n = len(batch.prompt_lengths)
    if n < world:
        raise ValueError(f"a batch of {n} ratings cannot be shared by {world} ranks (each needs one)")
    bounds = [round(i * n / world) for i in range(world + 1)]
    shares = []
    for lo, hi in zip(bounds, bounds[1:]):
        rows = slice(lo, hi)
        cut = {f.name: getattr(batch, f.name)[rows] for f in fields(batch)}
        shares.append((rows, replace(batch, **cut)))
    return shares


def _rank_env(rank: int, world: int) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT="0", TORCH_EXTENSIONS_DIR=extensions_dir(),  # DeepSpeed reads them; no TCP store is made
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the group's sockets on loopback only


def _join_group(rendezvous: str, rank: int, world: int) -> None:
    """Join the gloo group through the file store at `rendezvous` (in rank 0's private directory), then
    hand it to DeepSpeed, which uses a group that is already there."""
    import deepspeed
    import torch.distributed as dist

    store = dist.FileStore(rendezvous, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    deepspeed.init_distributed(dist_backend="gloo", timeout=COLLECTIVE_TIMEOUT)


def _die_with(parent: int) -> None:
    """Exit as soon as rank 0 is gone, wherever this process waits then (an import, a collective):
    a watcher thread (not PR_SET_PDEATHSIG, which follows the thread that spawned us, not rank 0)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="rank0-watch", daemon=True).start()


def _worker(rank: int, world: int, rendezvous: str, conn: Any, parent: int) -> None:
    """A worker rank: join the group, then follow rank 0's orders until Stop or rank 0 is gone."""
    _die_with(parent)
    _rank_env(rank, world)
    torch.set_num_threads(1)
    from liveloop.learner.methods import make_method

    _join_group(rendezvous, rank, world)
    opt: ZeroOptimizer | None = None
    method: Any = None
    config: LearnerConfig | None = None
    while True:
        try:
            order = conn.recv()
        except EOFError:  # rank 0 is gone
            break
        if isinstance(order, Stop):
            break
        if isinstance(order, Load):
            config = order.config
            model = placement(config).load_causal_lm(order.policy_dir)
            opt = ZeroOptimizer(model, order.lr, config.max_grad_norm, config.zero_stage, micro_batch(config, world), world)
            method = make_method(config)
        elif isinstance(order, Step):
            train_share(opt, method, config, order, world)
        elif isinstance(order, SetLr):
            opt.set_lr(order.lr)
        elif isinstance(order, Gather):
            with opt.full_parameters():
                pass
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# -- rank 0 ----------------------------------------------------------------------------------------
_GROUP: "RankGroup | None" = None  # this process's group (torch.distributed has one default group)


class RankGroup:
    """Rank 0's handle on the group: the worker processes and the pipes their orders go through. One
    per process, for the life of the process (torch.distributed has one default group).

    Workers are torch.multiprocessing (spawn) children of rank 0, not Ray actors nor the DeepSpeed
    launcher: the ranks are one lock-step job bound to one process group, started and ended with the
    learner, not services to schedule or supervise one by one. As children they need no Ray (the
    learner runs outside it too: `liveloop learn`, tests) and no CPU reservation from the private Ray's
    two; the DeepSpeed launcher starts whole programs from a command line, where the learner is a part
    of one. Orders travel over a pipe per worker (a worker may wait hours for the next rating without a
    gloo timeout). The ranks meet through a file store in a private directory (0700, made by rank 0),
    not torch's TCP store: that one listens on every interface whatever MASTER_ADDR says, and any host
    could join or poison the group through it. A worker watches its parent and exits when rank 0 is
    gone."""

    def __init__(self, world: int, processes: list[Any], conns: list[Any]):
        self.world = world
        self.processes = processes
        self.conns = conns
        self.closed = False

    @classmethod
    def start(cls, config: LearnerConfig) -> "RankGroup":
        """This process's group of `config.ranks` ranks: started on the first call (this process becomes
        rank 0, the workers spawn and join), the same group after that (a reload, a second learner)."""
        import torch.distributed as dist
        import torch.multiprocessing as mp

        global _GROUP
        world = config.ranks
        if world < 2:
            raise ValueError("a rank group needs ranks >= 2")
        if _GROUP is not None:
            if _GROUP.closed or _GROUP.world != world:
                raise RuntimeError(f"this process's rank group ({_GROUP.world} ranks) is closed or of another size")
            return _GROUP
        if dist.is_initialized():
            raise RuntimeError(
                f"this process already belongs to a process group of {dist.get_world_size()} rank(s); a learner with "
                "ranks > 1 needs a process of its own (the learner actor, `liveloop learn`)"
            )
        if placement(config).device.type != "cpu":
            raise ValueError("ranks > 1 runs on the CPU (gloo) so far: set [learner] device = 'cpu'")
        private = str(owned_temp_dir("ranks"))  # 0700, ours: only this user's processes can meet there
        rendezvous = os.path.join(private, "rendezvous")
        _rank_env(0, world)
        ctx = mp.get_context("spawn")
        processes, conns = [], []
        for rank in range(1, world):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(rank, world, rendezvous, theirs, os.getpid()), name=f"liveloop-rank{rank}", daemon=True)
            p.start()
            theirs.close()
            processes.append(p)
            conns.append(mine)
        atexit.register(shutil.rmtree, private, True)
        _join_group(rendezvous, 0, world)  # waits for every worker to join
        group = _GROUP = cls(world, processes, conns)
        atexit.register(group.close)
        log.info("learner rank group: %d ranks (pids %s)", world, [os.getpid()] + [p.pid for p in processes])
        return group

    def send(self, orders: list[Any]) -> None:
        """Order i to worker rank i + 1."""
        for rank, (p, conn, order) in enumerate(zip(self.processes, self.conns, orders), start=1):
            if not p.is_alive():
                raise RankFailed(f"learner rank {rank} is gone (exit code {p.exitcode})")
            conn.send(order)

    def send_all(self, order: Any) -> None:
        self.send([order] * (self.world - 1))

    def optimizer(self, model: nn.Module, policy_dir: str, lr: float, config: LearnerConfig) -> "RankedOptimizer":
        """Every worker loads `policy_dir`; rank 0 trains `model` (loaded from it); all build ZeRO engines."""
        return RankedOptimizer(self, model, policy_dir, lr, config)

    def close(self) -> None:
        """Stop the workers (at the end of the process: the group cannot start again in it)."""
        if self.closed:
            return
        self.closed = True
        for p, conn in zip(self.processes, self.conns):
            with contextlib.suppress(OSError, ValueError):
                if p.is_alive():
                    conn.send(Stop())
                conn.close()
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


class RankedOptimizer:
    """Rank 0's policy optimizer over the group: the rank-0 ZeroOptimizer plus orders to the workers.
    The step is `train` (the ranks compute the loss on their shares); `step(loss)` has no meaning here."""

    def __init__(self, group: RankGroup, model: nn.Module, policy_dir: str, lr: float, config: LearnerConfig):
        from liveloop.learner.methods import make_method

        self.group, self.config = group, config
        group.send_all(Load(str(policy_dir), config, lr))
        self.inner = ZeroOptimizer(model, lr, config.max_grad_norm, config.zero_stage, micro_batch(config, group.world), group.world)
        self.model, self.module, self.params = model, self.inner.module, self.inner.params
        self.stage = config.zero_stage
        self.method = make_method(config)

    def train(
        self, batch: TokenBatch, advantages: torch.Tensor, staleness: torch.Tensor, ref: torch.Tensor | None, kl_coef: float
    ) -> tuple[float | None, dict[str, float]]:
        """One policy step of the whole group on `batch`: shares 1..N-1 to the workers, share 0 here."""
        world = self.group.world
        total = float(batch.action_mask.sum().clamp(min=1))
        orders = []
        for rows, share in split(batch, world):
            weight = world * float(share.action_mask.sum()) / total
            orders.append(Step(share, advantages[rows], staleness[rows], None if ref is None else ref[rows], kl_coef, weight))
        self.group.send(orders[1:])
        return train_share(self.inner, self.method, self.config, orders[0], world)

    def step(self, loss: torch.Tensor) -> float | None:
        raise TypeError("a multi-rank policy step is RankedOptimizer.train (each rank computes its share's loss)")

    def set_lr(self, lr: float) -> None:
        self.group.send_all(SetLr(lr))
        self.inner.set_lr(lr)

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        """The full weights on rank 0 (ZeRO-3: gathered from every rank, which all join in)."""
        if self.stage == 3:
            self.group.send_all(Gather())
        with self.inner.full_parameters() as model:
            yield model
