"""Engine backends behind one small protocol (`base.Engine`), chosen by `[engine] backend`.

Engines are purely token-id machines: they know nothing of chat templates, HTTP or the store.
"""

from liveloop.server.engines.base import (
    CheckpointDir,
    Engine,
    Generation,
    GenerationRequest,
    NamedTensors,
    SamplingParams,
    TokenDelta,
    VersionGate,
    WeightSource,
    create_engine,
)

__all__ = [
    "CheckpointDir",
    "Engine",
    "Generation",
    "GenerationRequest",
    "NamedTensors",
    "SamplingParams",
    "TokenDelta",
    "VersionGate",
    "WeightSource",
    "create_engine",
]
