"""Per-segment LoRA adapters, backend-independent: which adapter serves each segment (`AdapterTable`:
segment -> `Lease`, with a count of the generations running on each adapter, bounded by
`max_adapters`), and the checks an adapter directory must pass before a backend loads it
(`read_adapter`).

Adapter names are the engine's own (`adapter_1`, `adapter_2`, ...), never reused: a segment name may
hold characters a backend refuses in a module name, and a name that is never reused can never make
a running generation continue on another adapter than the one it was admitted with.

A segment's new adapter is loaded before its table entry is repointed, so a failed load leaves the
old one serving. The old adapter stays loaded while generations admitted with it run; it is unloaded
when the last of them ends (`release`), or at once if none runs (`point`). A table key is a segment or
a segment's candidate slot (the release gate's, server/engines/canary.py); `move` repoints a slot's
adapter to another key without loading anything.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from liveloop.segments import Lineage
from liveloop.server.engines.base import AdapterUnusable

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class Lease:
    """An adapter a generation is served with: the version it records and the backend's name for it."""

    version: int
    name: str


@dataclass(frozen=True)
class AdapterSpec:
    """What the engine reads of an adapter directory before loading it."""

    path: Path
    rank: int  # the largest rank of any of its modules
    target_modules: tuple[str, ...] | str  # names (matched as module-name suffixes) or one regex
    target_parameters: tuple[str, ...] = ()  # peft target_parameters: "<module>.<parameter>" suffixes (fused MoE experts)


class AdapterTable:
    """Segment -> the adapter its new requests get, and per adapter the generations running on it.
    Used from the event loop only (no locking): every method runs without awaiting."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._current: dict[str, Lease] = {}
        self._running: Counter[str] = Counter()
        self._names = itertools.count(1)

    def current(self, segment: str) -> Lease | None:
        return self._current.get(segment)

    @property
    def held(self) -> set[str]:
        """Adapters loaded now: each segment's current one, and old ones still finishing a response."""
        return {lease.name for lease in self._current.values()} | set(self._running)

    def new_name(self) -> str:
        return f"adapter_{next(self._names)}"

    def acquire(self, lineage: Lineage) -> Lease | None:
        """The adapter a request of `lineage` is admitted with (None: the base weights), counted
        as running on it until `release`."""
        lease = None if lineage.is_base else self.current(lineage.segment)
        if lease is not None:
            self._running[lease.name] += 1
        return lease

    def release(self, lease: Lease) -> bool:
        """A generation admitted with `lease` ended; True when its adapter is to be unloaded now."""
        self._running[lease.name] -= 1
        if self._running[lease.name] > 0:
            return False
        del self._running[lease.name]
        return lease.name not in {current.name for current in self._current.values()}

    def check_room(self, segment: str) -> None:
        """Raise AdapterUnusable if loading one more adapter for `segment` would hold more than
        `capacity` once its old adapter (if no generation runs on it) is unloaded."""
        old = self._current.get(segment)
        freed = old is not None and old.name not in self._running
        after = len(self.held) + 1 - int(freed)
        if after > self.capacity:
            raise AdapterUnusable(
                f"segment {segment!r}: loading its adapter would hold {after} adapters, more than "
                f"engine.max_adapters = {self.capacity} (each segment's adapter, plus old ones still "
                "finishing a response); raise max_adapters or retry once those responses end"
            )

    def move(self, source: str, target: str) -> str | None:
        """Serve `target`'s new requests with the adapter `source` holds now (no load: a candidate slot's
        adapter becomes its segment's), `source` then holds none; returns the name of `target`'s old
        adapter if that is to be unloaded now. Raises LookupError if `source` holds none."""
        lease = self._current.pop(source, None)
        if lease is None:
            raise LookupError(f"no adapter is loaded under {source!r}")
        return self.point(target, lease)

    def point(self, segment: str, lease: Lease | None) -> str | None:
        """Serve `segment`'s new requests with `lease` (None: the base weights); returns the name of
        its old adapter if that is to be unloaded now (no generation runs on it)."""
        old = self._current.pop(segment, None)
        if lease is not None:
            self._current[segment] = lease
        if old is None or old.name in self._running:
            return None
        return old.name


def read_adapter(path: Path, max_rank: int) -> AdapterSpec:
    """Check that `path` is a peft LoRA `save_pretrained` directory the engine can serve: its config
    and weights are there, its rank is at most `max_rank`, and it changes nothing but its own LoRA
    matrices (no DoRA, no trained biases or whole modules: those would either not be per-adapter or
    not be routable per request; raw-parameter targets, peft's `target_parameters`, are LoRA matrices
    too and are read into the spec for the backend to serve or refuse). Raises AdapterUnusable."""
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise AdapterUnusable(f"adapter {path}: no {CONFIG_FILE} (not a peft save_pretrained directory)")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise AdapterUnusable(f"adapter {path}: no {' or '.join(WEIGHT_FILES)}")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterUnusable(f"adapter {path}: unreadable {CONFIG_FILE}: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise AdapterUnusable(f"adapter {path}: peft_type {config.get('peft_type') if isinstance(config, dict) else None!r} is not LORA")
    refused = {
        "use_dora": bool(config.get("use_dora")),
        "bias": config.get("bias", "none") != "none",
        "modules_to_save": bool(config.get("modules_to_save")),
        "trainable_token_indices": bool(config.get("trainable_token_indices")),
    }
    if any(refused.values()):
        raise AdapterUnusable(f"adapter {path}: {', '.join(k for k, v in refused.items() if v)} cannot be served per segment")
    rank = _rank(path, config)
    if rank > max_rank:
        raise AdapterUnusable(f"adapter {path}: rank {rank} is above engine.max_lora_rank = {max_rank}")
    parameters = config.get("target_parameters") or []
    if not isinstance(parameters, list) or not all(isinstance(t, str) and t for t in parameters):
        raise AdapterUnusable(f"adapter {path}: target_parameters {parameters!r} are not parameter names")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        return AdapterSpec(path, rank, targets, tuple(sorted(parameters)))
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets) or not (targets or parameters):
        raise AdapterUnusable(f"adapter {path}: target_modules {targets!r} names no module")
    return AdapterSpec(path, rank, tuple(sorted(targets)), tuple(sorted(parameters)))


def _rank(path: Path, config: dict) -> int:
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        raise AdapterUnusable(f"adapter {path}: ranks {ranks} are not positive integers")
    return max(ranks)
