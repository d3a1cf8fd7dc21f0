"""The messages between the server and the hf engine's own process (server/engines/hf/protocol.py):
frozen, one kind each, whole across a real pipe."""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle

import pytest

from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams, TokenDelta
from liveloop.server.engines.hf import protocol
from liveloop.server.engines.hf.protocol import (
    Cancel,
    Channel,
    Deltas,
    Done,
    Failed,
    Kind,
    Ready,
    Start,
    Stop,
    Submit,
    portable,
)
from liveloop.transport.weights import CheckpointDir

MESSAGES = [
    Start(EngineConfig(backend="hf", model="m"), "m", 3, None),
    Ready(),
    Failed(ValueError("no config.json")),
    Submit("7", GenerationRequest("r", (1, 2), SamplingParams(max_tokens=4)), None, 11),
    Cancel("7"),
    protocol.Swap(0, CheckpointDir("/tmp/ckpt"), 4, True),
    protocol.DropAdapter("adapter_1"),
    Stop(),
    Deltas((("7", TokenDelta([5], [-0.5], None, None, 3)), ("8", RuntimeError("row failed")))),
    Done(0, None, 0.25),
]


def test_each_kind_is_one_message_class():
    classes = [c for c in vars(protocol).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    assert sorted(c.kind.value for c in classes) == sorted(k.value for k in Kind)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind.value)
def test_messages_are_frozen_and_cross_a_pipe_whole(message):
    assert not hasattr(message, "__dict__")  # slots
    if dataclasses.fields(message):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, dataclasses.fields(message)[0].name, None)
    ours, theirs = multiprocessing.Pipe()
    try:
        Channel(ours).send(message)
        got = Channel(theirs).receive()
    finally:
        ours.close()
        theirs.close()
    assert type(got) is type(message) and got.kind is message.kind
    if not isinstance(message, (Failed, Deltas)):  # exceptions compare by identity
        assert got == message


def test_an_error_that_cannot_be_pickled_crosses_as_what_it_said():
    class Local(Exception):
        pass

    error = portable(Local("boom"))
    assert type(error) is RuntimeError and str(error) == "Local: boom"
    assert portable(None) is None and isinstance(pickle.loads(pickle.dumps(portable(KeyError("k")))), KeyError)
