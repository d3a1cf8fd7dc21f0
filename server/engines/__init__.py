"""Engine backends behind one small protocol (`base.Engine`), chosen by `[engine] backend` from the one
registry of backends (`registry.BACKENDS`: name, module, class, capabilities).

Engines are purely token-id machines: they know nothing of chat templates, HTTP or the store. The weights
they take (`CheckpointDir`, `NamedTensors`) are the transport layer's types: `liveloop.transport.weights`.
"""

from liveloop.server.engines.base import (
    Engine,
    Generation,
    GenerationRequest,
    SamplingParams,
    TokenDelta,
    VersionGate,
    create_engine,
)

__all__ = [
    "Engine",
    "Generation",
    "GenerationRequest",
    "SamplingParams",
    "TokenDelta",
    "VersionGate",
    "create_engine",
]
