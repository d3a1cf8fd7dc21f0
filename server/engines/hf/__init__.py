"""The `hf` backend (plain transformers): the engine and its worker thread (`engine`), its running
batch (`batch`), peft adapters inside the worker (`lora`), and the same engine in a process of its own
(`process` in the server, `child` in the engine's process, `protocol` the messages between them).

Imports nothing: `liveloop.server.engines.registry` names the modules, imported when a deployment
starts this backend."""
