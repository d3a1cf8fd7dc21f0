"""The hf engine's own process (started by hf/process.py as `python -m liveloop.server.engines.hf.child
FD`): it runs an `HFEngine` and its worker thread, unchanged, and drives it through the worker's public
interface (`ThreadedEngine.submit`, `stage`, `post_swap`, ...) from the messages of hf/protocol.py.

A worker hand-over goes back as one `Deltas` message (`PipeSink`). A swap's checkpoint is read here, on
a thread beside the worker's steps. If the parent dies the child reads the end of the pipe and exits;
if its worker stops (a failed copy) the child exits, so the parent sees the pipe end. The child ignores
SIGINT and SIGTERM, which a terminal or a supervisor sends to the whole process group: the server stops
it in order once its own streams ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.engines.hf.protocol import (
    Cancel,
    Channel,
    Deltas,
    Done,
    DropAdapter,
    Failed,
    LoadAdapter,
    Ready,
    Start,
    Stop,
    Submit,
    Swap,
    UnexpectedMessage,
    portable,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from liveloop.transport.weights import WeightSource


class PipeSink:
    """The child's stand-in for the server's event loop (a `threaded.Sink`): a hand-over of the worker
    goes to the parent as one message; a stream that ended is forgotten."""

    def __init__(self, channel: Channel, running: dict[str, threading.Event]):
        self.channel, self.running = channel, running

    def call_soon_threadsafe(self, callback: Callable[..., Any], items: list[tuple[str, Any]]) -> None:
        for rid, item in items:
            if isinstance(item, BaseException) or item.finish_reason is not None:
                self.running.pop(rid, None)
        with contextlib.suppress(OSError):  # the parent is gone: the main loop sees the pipe end
            self.channel.send(Deltas(tuple((rid, portable(item) if isinstance(item, BaseException) else item)
                                           for rid, item in items)))


def main(conn: Connection) -> None:
    # a signal to the server's process group (Ctrl-C, a supervisor's SIGTERM) reaches this process too:
    # its server stops it in order (its streams end first); if the server is gone, the pipe's end stops it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)
    channel = Channel(conn)
    try:
        start = channel.receive()
        if not isinstance(start, Start):
            raise UnexpectedMessage(f"hf engine process: expected a start message, got {start.kind.value}")
        engine = HFEngine(start.config, start.model_path)
        asyncio.run(engine.start(start.version, start.weights_path))
    except (EOFError, OSError):  # the parent is gone
        return
    except BaseException as exc:
        channel.send(Failed(portable(exc)))
        return
    try:
        channel.send(Ready())
        _serve(engine, channel)
    finally:
        engine.stop_worker(10)


def _serve(engine: HFEngine, channel: Channel) -> None:
    """Read the parent's messages until it stops the engine or goes, or the worker stops."""
    running: dict[str, threading.Event] = {}  # rid -> its cancelled event, while it runs
    sink = PipeSink(channel, running)

    def reply(mid: int) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            with contextlib.suppress(OSError):
                channel.send(Done(mid, portable(error), engine.copy_seconds))
        return done

    def stage_then_swap(mid: int, source: WeightSource, version: int, keep: bool) -> None:
        try:
            staged = engine.stage(source)  # a checkpoint is read here, beside the worker's steps
        except BaseException as exc:
            reply(mid)(exc)
            return
        engine.post_swap(staged, version, keep, reply(mid))

    while True:
        if not channel.poll(0.5):
            if not engine.healthy():  # its worker stopped (a failed copy): end, so the parent knows
                return
            continue
        try:
            message = channel.receive()
        except (EOFError, OSError):  # the parent is gone
            return
        match message:
            case Submit(rid, request, adapter, seed):
                cancelled = threading.Event()
                running[rid] = cancelled
                engine.submit(request, seed, adapter, sink, rid, cancelled)
            case Cancel(rid):
                if (cancelled := running.pop(rid, None)) is not None:
                    cancelled.set()
            case Swap(mid, source, version, keep):
                threading.Thread(target=stage_then_swap, args=(mid, source, version, keep), daemon=True).start()
            case LoadAdapter(mid, spec, name):
                engine.post_load_adapter(spec, name, reply(mid))
            case DropAdapter(name):
                engine.post_drop_adapter(name)
            case Stop():
                return


if __name__ == "__main__":
    from multiprocessing.connection import Connection as _Connection

    main(_Connection(int(sys.argv[1])))
