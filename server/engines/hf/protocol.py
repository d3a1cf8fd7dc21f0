"""The messages between the server and the hf engine's own process (hf/process.py, hf/child.py), as
vLLM's EngineCoreRequest / EngineCoreOutputs are: frozen dataclasses, each with its `Kind`, pickled
whole over one pipe (`Channel`). Plain data only, never a function: a checkpoint crosses as its path
(read in the child), tensors by value.

    server -> engine   Start, Submit, Cancel, Swap, LoadAdapter, DropAdapter, Stop
    engine -> server   Ready | Failed (the answer to Start), Deltas, Done (the answer to Swap, LoadAdapter)

Deltas cross once per hand-over of the worker (one `Deltas` for every stream's new tokens), so the pipe
costs one write per step, not one per token. Requests are known by `rid`, swaps and adapter loads by
`mid` (the `Done` that answers them)."""

from __future__ import annotations

import enum
import pickle
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.adapters import AdapterSpec
    from liveloop.server.engines.base import GenerationRequest, TokenDelta
    from liveloop.transport.weights import WeightSource


class UnexpectedMessage(RuntimeError):
    """A message of a kind the receiving side does not take at that point."""


class Kind(enum.Enum):
    START = "start"
    READY = "ready"
    FAILED = "failed"
    SUBMIT = "submit"
    CANCEL = "cancel"
    SWAP = "swap"
    LOAD_ADAPTER = "load_adapter"
    DROP_ADAPTER = "drop_adapter"
    STOP = "stop"
    DELTAS = "deltas"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Start:
    """Load the model (then the checkpoint `weights_path`, if any) and serve it as `version`."""

    kind: ClassVar[Kind] = Kind.START
    config: EngineConfig
    model_path: str
    version: int
    weights_path: str | None


@dataclass(frozen=True, slots=True)
class Ready:
    """The engine started: its worker is serving."""

    kind: ClassVar[Kind] = Kind.READY


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not start (the process then exits)."""

    kind: ClassVar[Kind] = Kind.FAILED
    error: BaseException


@dataclass(frozen=True, slots=True)
class Submit:
    """Generate for `request`, sampling with `seed`, served with the loaded adapter `adapter` (None: the base weights)."""

    kind: ClassVar[Kind] = Kind.SUBMIT
    rid: str
    request: GenerationRequest
    adapter: str | None
    seed: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop generating for `rid` (a swap preempted it, or its reader left)."""

    kind: ClassVar[Kind] = Kind.CANCEL
    rid: str


@dataclass(frozen=True, slots=True)
class Swap:
    """Load `source` as `version`; `keep`: continue the running generations under it."""

    kind: ClassVar[Kind] = Kind.SWAP
    mid: int
    source: WeightSource
    version: int
    keep: bool


@dataclass(frozen=True, slots=True)
class LoadAdapter:
    """Load the checked adapter `spec` under `name`."""

    kind: ClassVar[Kind] = Kind.LOAD_ADAPTER
    mid: int
    spec: AdapterSpec
    name: str


@dataclass(frozen=True, slots=True)
class DropAdapter:
    """Unload adapter `name`: no admitted generation runs on it any more."""

    kind: ClassVar[Kind] = Kind.DROP_ADAPTER
    name: str


@dataclass(frozen=True, slots=True)
class Stop:
    """End the engine's process (the server is closing it)."""

    kind: ClassVar[Kind] = Kind.STOP


@dataclass(frozen=True, slots=True)
class Deltas:
    """One hand-over of the worker: each stream's new delta, or the error that ended it."""

    kind: ClassVar[Kind] = Kind.DELTAS
    items: tuple[tuple[str, TokenDelta | BaseException], ...]


@dataclass(frozen=True, slots=True)
class Done:
    """The outcome of swap or adapter load `mid` (None: done), and the seconds the last copy held the worker's steps."""

    kind: ClassVar[Kind] = Kind.DONE
    mid: int
    error: BaseException | None
    copy_seconds: float


ToEngine = Start | Submit | Cancel | Swap | LoadAdapter | DropAdapter | Stop
FromEngine = Ready | Failed | Deltas | Done
Message = ToEngine | FromEngine


class Channel:
    """One end of the pipe: whole pickled messages, sent by any thread one at a time."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)

    def receive(self) -> Message:
        return pickle.loads(self.conn.recv_bytes())

    def poll(self, timeout: float) -> bool:
        return self.conn.poll(timeout)

    def close(self) -> None:
        self.conn.close()


def portable(error: BaseException | None) -> BaseException | None:
    """`error` if it survives pickling, else a RuntimeError that says what it was."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
