"""Engine backends behind one small protocol (`base.Engine`), chosen by `[engine] backend` from the one
registry of backends (`registry.ROWS`: name, module, class, capabilities; one row per home). Grouped by
family: `hf/` (transformers, on a thread or in a process of its own), `vllm/`, and the single-module
`sglang_engine` and `diffusion_engine`; what they share (`base`, `gated`, `threaded`, `adapters`,
`canary`, `registry`) sits here. Design notes: docs/engines.md.

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
