"""The `vllm` backend: the engine around vLLM's AsyncLLM (`engine`), the extension its worker
processes run (`worker`: weights shared through /dev/shm), and the swaps staged beside the serving
model (`staging`).

Imports nothing (vllm is imported only where the backend serves): `liveloop.server.engines.registry`
names the modules."""
