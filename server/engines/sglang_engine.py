"""The `sglang` backend: an HTTP client (httpx, async) of a running SGLang server (`[engine] sglang_url`),
through SGLang's native API (python/sglang/srt/entrypoints/http_server.py; request and response shapes
from python/sglang/srt/managers/io_struct.py and tokenizer_manager.py).

SGLang runs the model in its own processes; liveloop owns what it serves: the version label, the swaps,
the adapters. Start SGLang on the same machine, with `--api-key` (sent from the variable
`[engine] sglang_api_key_env` names), `SGLANG_RETURN_ORIGINAL_LOGPROB=1` (raw behaviour logprobs) and
`--disable-radix-cache` (keep swaps need it; with it on they drain):

    SGLANG_RETURN_ORIGINAL_LOGPROB=1 python -m sglang.launch_server --model-path models/liveloop-tiny \\
        --port 30000 --disable-radix-cache --api-key "$SGLANG_API_KEY" [--enable-lora ...]

Generation: POST /generate, streamed as server-sent events; each delta's `TokenDelta.version` is the
chunk's `weight_version` label, which liveloop sets at start and every swap. Swaps: a checkpoint by
path (/update_weights_from_disk; named tensors are written as a checkpoint first); keep swaps pause
with "retract" and continue. Stragglers: /abort_request. `healthy()` reads the last polled /health.
Adapters: /load_lora_adapter, /unload_lora_adapter. Each call's fields and what is still unknown:
docs/engines.md, "The sglang engine".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import AdapterUnusable, EngineUnavailable, GenerationRequest, Preempt, SamplingParams, TokenDelta, aborted
from liveloop.server.engines.gated import GatedEngine
from liveloop.transport.weights import CheckpointDir, NamedTensors, WeightSource, WeightsRejected, copy_checkpoint, non_finite, write_checkpoint

if TYPE_CHECKING:
    import httpx

    from liveloop.server.config import EngineConfig

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
    """SGLang answered a call with an error (its message is in this one's)."""


class SGLangUnreachable(SGLangError, EngineUnavailable):
    """No answer from the SGLang server at `engine.sglang_url` (down, or past `sglang_timeout_seconds`)."""


# -- the mapping between liveloop's values and SGLang's JSON (pure functions, unit-tested) ------------------


def generate_body(request: GenerationRequest, rid: str, adapter: str | None = None) -> dict[str, Any]:
    """The JSON of SGLang's POST /generate (GenerateReqInput) for one liveloop request, streamed."""
    s: SamplingParams = request.sampling
    sampling: dict[str, Any] = {
        "max_new_tokens": s.max_tokens,
        "temperature": s.temperature,  # 0: SGLang samples greedily (top_k = 1)
        "top_p": s.top_p,
        # the stop tokens are all liveloop's (the model's eos among them unless the request ignores it),
        # so SGLang's own eos check stays off, as on vLLM
        "ignore_eos": True,
    }
    if s.stop_token_ids:
        sampling["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        sampling["sampling_seed"] = s.seed
    if s.top_k:
        sampling["top_k"] = s.top_k
    if s.min_p:
        sampling["min_p"] = s.min_p
    if s.repetition_penalty != 1.0:
        sampling["repetition_penalty"] = s.repetition_penalty
    if s.min_tokens:
        sampling["min_new_tokens"] = s.min_tokens
    body: dict[str, Any] = {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling,
        "rid": rid,
        "return_logprob": True,
        "logprob_start_len": -1,  # output tokens only
        "stream": True,
    }
    if s.top_logprobs:
        body["top_logprobs_num"] = s.top_logprobs
    if adapter is not None:
        body["lora_path"] = adapter  # a loaded adapter's lora_name
    return body


def weight_version(label: Any) -> int | None:
    """liveloop's version from SGLang's `weight_version` label (None: a label liveloop did not set)."""
    if isinstance(label, int) and not isinstance(label, bool):
        return label
    if isinstance(label, str) and label.isdigit():
        return int(label)
    return None


def finish_reason(reason: Any) -> str | None:
    """SGLang's `meta_info.finish_reason` ({"type": ...} or None) as liveloop's."""
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(kind, "abort" if kind is None else str(kind))


def chunk_delta(chunk: dict[str, Any], sent: int) -> tuple[TokenDelta | None, int]:
    """One streamed /generate chunk as the delta of its new tokens (None: nothing new and not finished),
    and the output tokens sent after it. Raises SGLangError for an error chunk or one without logprobs."""
    if "error" in chunk:
        err = chunk["error"]
        raise SGLangError(f"sglang /generate: {err.get('message', err) if isinstance(err, dict) else err}")
    meta = chunk.get("meta_info")
    if not isinstance(meta, dict) or "completion_tokens" not in meta:
        raise SGLangError(f"sglang /generate: a chunk without meta_info.completion_tokens: {str(chunk)[:200]}")
    total = int(meta["completion_tokens"])
    new = total - sent
    triples = meta.get("output_token_logprobs") or []
    if new < 0 or new > len(triples):
        raise SGLangError(
            f"sglang /generate: {new} new tokens but {len(triples)} output_token_logprobs (return_logprob ignored?)"
        )
    fresh = triples[len(triples) - new:] if new else []
    ids = [int(t[1]) for t in fresh]
    logprobs = [float(t[0]) for t in fresh]
    top = None
    if meta.get("output_top_logprobs") is not None:
        positions = meta["output_top_logprobs"]
        picked = positions[len(positions) - new:] if new else []
        top = [sorted(((int(t[1]), float(t[0])) for t in (pos or [])), key=lambda x: -x[1]) for pos in picked]
    finish = finish_reason(meta.get("finish_reason"))
    if not ids and finish is None:
        return None, total
    cached = meta.get("cached_tokens") if sent == 0 else None  # the prompt's, said with the first tokens
    return TokenDelta(ids, logprobs, top, finish, weight_version(meta.get("weight_version")),
                      int(cached) if isinstance(cached, int) else None), total


# -- the backend ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Handle:
    """One admitted generation, as a swap that has to end it sees it."""

    rid: str
    preempted: bool = False


class SGLangEngine(GatedEngine):
    name = "sglang"
    keeps_generations = True  # pause_generation(mode="retract"): see the module docstring
    # SGLang's sampling parameters of the same names (min_tokens is its min_new_tokens). Constrained
    # decoding is not offered: what SGLang reports as a token's logprob under its grammar has not been
    # checked against a forward pass here (no SGLang runs on this machine), so it stays refused
    sampling_extensions = frozenset({"top_k", "min_p", "repetition_penalty", "min_tokens"})

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.supports_adapters = config.max_adapters > 0
        self.url = config.sglang_url.rstrip("/")
        self._client: httpx.AsyncClient | None = None
        self._health_ok = False  # what the last /health answered
        self._unreachable: str | None = None  # why the last call found no server (cleared by a good /health)
        self._poller: asyncio.Task | None = None
        self._written: Path | None = None  # a directory of the engine's own (written from named tensors, or a copy of one handed over), while SGLang serves it
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle ----------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        return self._client is not None and self._health_ok and self._unreachable is None

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        import httpx

        key = os.environ.get(self.config.sglang_api_key_env, "") if self.config.sglang_api_key_env else ""
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(self.config.sglang_timeout_seconds, connect=10.0), trust_env=False,
            headers={"Authorization": f"Bearer {key}"} if key else None,
        )
        try:
            info = await self._get("/get_model_info")
            if info.get("is_generation") is False:
                raise SGLangError(f"sglang at {self.url} serves {info.get('model_path')}, which is not a generation model")
            log.info("sglang engine: %s serves %s (weight_version %r)", self.url, info.get("model_path"), info.get("weight_version"))
            if self.swap_keeps:
                server = await self._get("/get_server_info")
                if not server.get("disable_radix_cache", False):
                    self.swap_keeps = False
                    log.warning(
                        "sglang engine: %s runs with its radix cache on (old prefix KV would serve new weights): "
                        "swap_mode 'keep' needs --disable-radix-cache; swaps drain", self.url,
                    )
            serving = info.get("model_path")
            if weights_path is None and serving and Path(serving).resolve() == Path(self.model_path).resolve():
                await self._post("/update_weight_version", {"new_version": str(version)})
            else:  # it serves other weights (an earlier run's swap): what liveloop calls `version` is loaded
                staged = await asyncio.to_thread(self._stage, CheckpointDir(Path(weights_path or self.model_path)))
                assert isinstance(staged, CheckpointDir)
                await self._apply_as(staged, version)
            await self._check_health()
            if not self.healthy():
                raise SGLangError(f"sglang at {self.url} is not healthy: {self._unreachable or 'GET /health did not answer 200'}")
        except BaseException:
            await self.close()
            raise
        self._gate.version = version
        self._sweep(keep=self._written)  # SGLang serves engine.model or our copy of the given checkpoint now
        self._poller = asyncio.get_running_loop().create_task(self._poll_health())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._health_ok = False

    async def _poll_health(self) -> None:
        while True:
            await asyncio.sleep(self.config.sglang_health_seconds)
            await self._check_health()

    async def _check_health(self) -> None:
        import httpx

        try:
            resp = await self._client.get("/health")
        except httpx.TransportError as exc:
            self._health_ok, self._unreachable = False, f"GET /health: {exc!r}"
            return
        self._health_ok = resp.status_code == 200
        if self._health_ok:
            self._unreachable = None
        else:
            log.warning("sglang engine: GET %s/health answered %d", self.url, resp.status_code)

    # -- HTTP -------------------------------------------------------------------------------------------
    async def _call(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        import httpx

        if self._client is None:
            raise SGLangUnreachable(f"sglang engine: not started (or closed): {method} {path}")
        try:
            resp = await self._client.request(method, path, json=body)
        except httpx.TransportError as exc:
            self._unreachable = f"{method} {path}: {exc!r}"
            raise SGLangUnreachable(f"sglang at {self.url} did not answer {method} {path}: {exc!r}") from exc
        return resp

    async def _get(self, path: str) -> dict:
        resp = await self._call("GET", path)
        if resp.status_code != 200:
            raise SGLangError(f"sglang GET {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    async def _post(self, path: str, body: dict) -> dict:
        resp = await self._call("POST", path, body)
        if resp.status_code != 200:
            raise SGLangError(f"sglang POST {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except ValueError:
            return {"message": resp.text}

    # -- generation -------------------------------------------------------------------------------------
    def _admit(self, request: GenerationRequest, adapter: str | None = None) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        # rids unique per call: SGLang refuses a rid in flight, and some versions abort by rid prefix
        handle = _Handle(f"{request.request_id}-{uuid.uuid4().hex[:8]}")
        return (lambda: self._preempt(handle)), self._stream(request, handle, adapter)

    async def _preempt(self, handle: _Handle) -> None:
        handle.preempted = True
        # a no-op for a request SGLang has finished (or not seen yet: its stream then ends at once)
        await self._post("/abort_request", {"rid": handle.rid})

    async def _stream(self, request: GenerationRequest, handle: _Handle, adapter: str | None) -> AsyncIterator[TokenDelta]:
        import httpx

        if handle.preempted:
            yield aborted()
            return
        if self._client is None:
            raise SGLangUnreachable("sglang engine: not started (or closed)")
        body = generate_body(request, handle.rid, adapter)
        sent, finished = 0, False
        try:
            async with self._client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise SGLangError(f"sglang /generate: HTTP {resp.status_code}: {text[:300]}")
                async for line in resp.aiter_lines():
                    if handle.preempted:  # a swap ended it: SGLang has aborted it
                        yield aborted()
                        return
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    delta, sent = chunk_delta(json.loads(data), sent)
                    if delta is None:
                        continue
                    finished = delta.finish_reason is not None
                    if adapter is not None:
                        delta.version = None  # the adapter's version: Generation.version
                    yield delta  # after a finished delta the stream ends with [DONE]
        except httpx.TransportError as exc:
            if handle.preempted:
                yield aborted()
                return
            self._unreachable = f"POST /generate: {exc!r}"
            raise SGLangUnreachable(f"sglang at {self.url}: /generate failed: {exc!r}") from exc
        if not finished and handle.preempted:  # SGLang ended the aborted request's stream early
            yield aborted()
        elif not finished:
            raise SGLangUnreachable(f"sglang at {self.url}: the /generate stream of {handle.rid} ended unfinished")

    # -- swaps ------------------------------------------------------------------------------------------
    def _stage(self, source: WeightSource) -> WeightSource:
        """What SGLang is told to load, as a directory of this engine's own that stays until SGLang serves
        another: SGLang keeps serving from the `model_path` it loaded (a refused update later reloads the
        weights it served from there), while the directory a caller hands over is often a verified private
        copy it removes after the swap. So a checkpoint directory is copied under the engine's root
        (the configured model's own directory and one of the engine's are kept as they are); named
        tensors are checked finite (unless verified) and written there. In a thread, before anything
        pauses."""
        match source:
            case CheckpointDir(path):
                path = Path(path).resolve()
                if not path.is_dir():
                    raise WeightsRejected(f"sglang engine: {path} is not a checkpoint directory")
                if path == Path(self.model_path).resolve() or self._is_written(path):
                    return CheckpointDir(path)
                return CheckpointDir(copy_checkpoint(path, self._written_root()).resolve())
            case NamedTensors(tensors, verified):
                bad = None if verified else non_finite(tensors)
                if bad is not None:
                    raise WeightsRejected(f"update_weights: non-finite values in {bad}")
                return CheckpointDir(write_checkpoint(tensors, self.model_path, self._written_root()).resolve())
        raise TypeError(f"sglang engine: cannot load weights from {type(source).__name__}")

    async def _apply_as(self, source: CheckpointDir, version: int) -> float | None:
        written = source.path if self._is_written(source.path) else None
        try:
            if not self.swap_keeps:  # the gate has drained: nothing of liveloop's runs
                await self._update_from_disk(source.path, version, flush=True)
                held = None
            else:
                loop = asyncio.get_running_loop()
                paused = loop.time()
                await self._post("/pause_generation", {"mode": "retract"})
                try:
                    await self._update_from_disk(source.path, version, flush=False)
                finally:
                    await self._post("/continue_generation", {})
                held = loop.time() - paused
        except BaseException:
            if written is not None:
                shutil.rmtree(written, ignore_errors=True)
            raise
        previous, self._written = self._written, written
        if previous is not None and previous != written:
            shutil.rmtree(previous, ignore_errors=True)  # SGLang serves the new directory now
        return held

    def _written_root(self) -> Path:
        return (Path(self.config.checkpoint_dir) / "sglang").resolve()

    def _is_written(self, path: Path) -> bool:
        return Path(path).parent == self._written_root()

    def _sweep(self, keep: Path | None) -> None:
        """Remove the directories written from named tensors that SGLang does not serve (an earlier run's)."""
        for old in self._written_root().glob("push-*"):
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    async def _update_from_disk(self, path: Path, version: int, flush: bool) -> None:
        # UpdateWeightFromDiskReqInput: model_path, weight_version (set only on success), flush_cache
        body = {"model_path": str(path), "weight_version": str(version), "flush_cache": flush}
        resp = await self._call("POST", "/update_weights_from_disk", body)
        try:
            answer = resp.json()
        except ValueError:
            answer = {"success": False, "message": resp.text[:300]}
        if resp.status_code == 200 and answer.get("success", False):
            return
        message = answer.get("message") or answer
        if resp.status_code == 400:  # SGLang refused it and reloaded the weights it served
            raise WeightsRejected(f"sglang refused the weights in {path} (version {version}): {message}")
        raise SGLangError(f"sglang /update_weights_from_disk: HTTP {resp.status_code}: {message}")

    # -- adapters ---------------------------------------------------------------------------------------
    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        resp = await self._call("POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(spec.path.resolve())})
        try:
            answer = resp.json()
        except ValueError:
            answer = {"success": False, "error_message": resp.text[:300]}
        if resp.status_code != 200 or not answer.get("success", False):
            raise AdapterUnusable(f"adapter {spec.path}: sglang could not load it: {answer.get('error_message') or answer}")

    def _unload_adapter(self, name: str) -> None:
        if self._client is None:
            return
        task = asyncio.get_running_loop().create_task(self._unload(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unload(self, name: str) -> None:
        try:
            await self._post("/unload_lora_adapter", {"lora_name": name})
        except SGLangError:  # it stays loaded in SGLang; nothing serves it any more
            log.exception("sglang engine: unloading adapter %s failed", name)
