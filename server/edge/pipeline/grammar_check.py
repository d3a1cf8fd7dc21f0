"""Whether a request's constraint compiles, within a deadline: in a child process that is killed when
a compile runs past `[server] grammar_compile_seconds`, so a schema xgrammar takes seconds or minutes to
compile (nested bounded repeats in a `pattern`: one measured 21 s here) costs its own request a 400
`grammar_too_complex`, never the prompt thread every request is prepared on for longer than the deadline.

The child holds only xgrammar and the model's tokenizer info (serialized once by the parent) and a
bounded compile cache of its own; it starts in the background when the server does (`start`) and again
at once after each kill, so no request waits for a child to import xgrammar (about 1.5 s here).
Checks take turns (one child, one compile at a time); the engines compile the same text in their own
processes afterwards, which a grammar that passed here does within about the same time."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from multiprocessing.connection import Connection
from typing import Any

from liveloop.grammar import CACHE_LIMIT_BYTES, InvalidConstraint

log = logging.getLogger(__name__)
START_SECONDS = 60.0  # how long a fresh child may take to import xgrammar and read the tokenizer info


class GrammarTooComplex(InvalidConstraint):
    """A constraint that did not compile within the deadline (its compile was stopped)."""


class CheckerUnavailable(RuntimeError):
    """The checker cannot check now (closed: the server is stopping; or its child did not start): the
    server's state, not the constraint's fault, so the client may retry (503)."""


def _serve(conn: Connection, info_json: str) -> None:
    """The child: compile each constraint it is sent, answer (True, "") or (False, the error)."""
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(info_json), max_threads=1, cache_enabled=True,
                                   cache_limit_bytes=CACHE_LIMIT_BYTES)
    conn.send((True, "ready"))
    while True:
        try:
            constraint = conn.recv()
        except EOFError:
            return
        try:
            compiler.compile_structural_tag(constraint)
            conn.send((True, ""))
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError / its own types
            conn.send((False, str(exc)[:300]))


class GrammarChecker:
    """Compiles constraints in a child process with a deadline. Thread-safe (checks take turns)."""

    def __init__(self, info: Any, deadline_seconds: float):
        """`info`: the model's xgrammar TokenizerInfo (what liveloop.grammar's `Grammars.info` holds)."""
        self._info_json: str = info.serialize_json()
        self.deadline = deadline_seconds
        self._lock = threading.Lock()
        self._child: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._closed = False
        self.stopped = 0  # compiles stopped at the deadline (each a killed child)

    def start(self) -> threading.Thread:
        """Start the child in the background (it takes the lock: a check that comes meanwhile waits for it);
        the thread that starts it."""
        thread = threading.Thread(target=self._standby, name="liveloop-grammar-standby", daemon=True)
        thread.start()
        return thread

    def _standby(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._ready()
            except Exception:  # the next check starts it again, and says why if it cannot
                log.exception("the grammar checker's child did not start")

    def check(self, constraint: str) -> None:
        """Return when `constraint` compiles; raise InvalidConstraint when it does not, GrammarTooComplex
        when it did not within the deadline, CheckerUnavailable when it cannot check now."""
        with self._lock:
            conn = self._ready()
            conn.send(constraint)
            if not conn.poll(self.deadline):
                self._replace()
                self.stopped += 1
                raise GrammarTooComplex(f"the constraint did not compile within {self.deadline:g} s")
            try:
                ok, error = conn.recv()
            except EOFError:  # the child died compiling it (out of memory)
                self._replace()
                raise GrammarTooComplex("the constraint's compile ran out of memory") from None
        if not ok:
            raise InvalidConstraint(f"the constraint does not compile: {error}")

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        return self._child.pid if self._child is not None and self._child.is_alive() else None

    def _ready(self) -> Connection:
        if self._closed:  # a check that waited out `close`: no child after it
            raise CheckerUnavailable("the server is stopping: the grammar checker is closed")
        if self._child is not None and self._child.is_alive() and self._conn is not None:
            return self._conn
        self._kill()
        ctx = multiprocessing.get_context("spawn")  # the server has threads: never fork it
        parent, child = ctx.Pipe()
        self._child = ctx.Process(target=_serve, args=(child, self._info_json), name="liveloop-grammar-check", daemon=True)
        self._child.start()
        child.close()
        self._conn = parent
        try:
            ready = parent.poll(START_SECONDS) and parent.recv() == (True, "ready")
        except EOFError:
            ready = False
        if not ready:
            self._kill()
            raise CheckerUnavailable(f"the grammar checker did not start within {START_SECONDS:g} s")
        return parent

    def _replace(self) -> None:
        """Kill the child (the lock is held) and start the next in the background once the lock is free."""
        self._kill()
        self.start()

    def _kill(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.join(10)
        if self._conn is not None:
            self._conn.close()
        self._child, self._conn = None, None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._kill()
