"""A STAND-IN for an SGLang server (`python -m sglang.launch_server`), for tests on machines where SGLang
cannot run (its kernel package is CUDA-only). It is not SGLang: it runs a causal LM with transformers on
the CPU, one full forward per token (no KV cache, so a weight update mid-request takes effect at the
next token, as SGLang's `retract` pause does), and reproduces only the request and response shapes of
the native endpoints liveloop's `sglang` engine calls (python/sglang/srt/entrypoints/http_server.py,
python/sglang/srt/managers/io_struct.py):

- POST /generate: `input_ids`, `sampling_params` (`max_new_tokens`, `temperature`, `top_p`,
  `stop_token_ids`, `ignore_eos` (the model's eos then stops nothing), `sampling_seed`; SGLang's
  `top_k`, `min_p`, `repetition_penalty` and `min_new_tokens` are taken and not applied), `rid`, `return_logprob`, `logprob_start_len`, `top_logprobs_num`,
  `stream`, `lora_path`. Streamed as server-sent events `data: {...}` and `data: [DONE]`, one chunk per
  token, each `{"text", "output_ids", "meta_info"}` with `meta_info` {`id`, `finish_reason` (None or
  {"type": "stop", "matched": id} | {"type": "length", "length": n} | {"type": "abort", "message"}),
  `prompt_tokens`, `completion_tokens`, `cached_tokens`, `weight_version` (the label when the chunk is
  sent), `output_token_logprobs` ([logprob, token_id, None] triples, all so far: SGLang's default,
  non-incremental streaming), `output_top_logprobs`}. Logprobs are the raw log-softmax (SGLang with
  SGLANG_RETURN_ORIGINAL_LOGPROB=1). A bad request is HTTP 400 with SGLang's ErrorResponse body.
- POST /update_weights_from_disk {`model_path`, `weight_version`, `flush_cache`, ...}: without a pause
  it waits for running requests (SGLang's model-update lock); 200 {"success": true, "message",
  "num_paused_requests"}, or 400 {"success": false, ...} with the old weights serving.
- POST /update_weight_version {`new_version`}; GET /get_weight_version; GET /get_model_info;
  GET /get_server_info (`disable_radix_cache`, `version`); GET /health and /health_generate;
  GET|POST /flush_cache (400 while requests run or wait); POST /pause_generation {`mode`}
  ("abort" | "retract" | "in_place") and /continue_generation; POST /abort_request {`rid`, `abort_all`};
  GET|POST /slow_down {`forward_sleep_time`} (SGLang's testing aid: each forward sleeps that long);
  POST /load_lora_adapter and /unload_lora_adapter (refused: this stand-in has no LoRA, as SGLang
  started without --enable-lora).

With `--api-key KEY` every endpoint but GET /health answers 401 unless the request carries
`Authorization: Bearer KEY` (SGLang's own --api-key check, as far as liveloop's calls go).

    python tests/standins/sglang_server.py --model-path models/liveloop-tiny --port 30000 [--disable-radix-cache] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ABORTED = {"type": "abort", "message": "Aborted by AbortReq."}


def _error(message: str, status: int = 400) -> JSONResponse:
    # sglang.srt.entrypoints.openai.protocol.ErrorResponse, as http_server's handlers send it
    return JSONResponse({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": status},
                        status_code=status)


@dataclass(eq=False)
class _Running:
    rid: str
    aborted: bool = False


@dataclass
class StandIn:
    model_path: str
    disable_radix_cache: bool
    model: Any = None
    eos: set[int] = field(default_factory=set)
    weight_version: str = "default"  # SGLang's ServerArgs.weight_version default
    running: dict[str, _Running] = field(default_factory=dict)
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set: generation may run
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one forward or one weight load at a time
    updating: bool = False
    forward_sleep_time: float | None = None  # set by POST /slow_down (SGLang: "only for testing")

    def load(self, path: str) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.eval()
        eos = set()
        try:
            ids = GenerationConfig.from_pretrained(path).eos_token_id
            eos = set(ids if isinstance(ids, list) else [ids]) - {None}
        except OSError:
            pass
        self.model, self.eos = model, eos  # only once the whole load succeeded

    def step(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)


def _sample(logprobs: torch.Tensor, sp: dict, gen: torch.Generator) -> int:
    temperature = float(sp.get("temperature", 1.0))
    if temperature < 1e-6:
        return int(torch.argmax(logprobs))
    probs = torch.softmax(logprobs / temperature, dim=-1)
    top_p = float(sp.get("top_p", 1.0))
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))


def _check(body: dict) -> str | None:
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return "input_ids: a non-empty list of token ids is required (this stand-in takes no text)"
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        return "sampling_params must be an object"
    t = sp.get("temperature", 1.0)
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        return f"temperature must be a non-negative finite number, got {t}."
    if not 0.0 < float(sp.get("top_p", 1.0)) <= 1.0:
        return f"top_p must be in (0, 1], got {sp.get('top_p')}."
    n = sp.get("max_new_tokens", 128)
    if not isinstance(n, int) or n < 0:
        return f"max_new_tokens must be at least 0, got {n}."
    if body.get("lora_path") is not None:
        return "LoRA is not enabled on this server (stand-in: no adapters are loaded)"
    return None


def build_app(state: StandIn, api_key: str | None = None) -> FastAPI:
    app = FastAPI()

    if api_key:
        @app.middleware("http")
        async def check_key(request: Request, call_next):
            if request.url.path != "/health" and request.headers.get("authorization") != f"Bearer {api_key}":
                return _error("Unauthorized", 401)
            return await call_next(request)
    tokenizer_path = state.model_path

    async def generate_tokens(body: dict, run: _Running):
        sp = body.get("sampling_params") or {}
        ids = list(body["input_ids"])
        prompt_tokens = len(ids)
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or ()) | (set() if sp.get("ignore_eos") else state.eos)
        gen = torch.Generator().manual_seed(int(sp.get("sampling_seed") or 0))
        top_n = int(body.get("top_logprobs_num") or 0)
        out_ids: list[int] = []
        triples: list[list] = []
        tops: list[list] = []
        if max_new == 0:
            state.running.pop(run.rid, None)
            yield out_ids, triples, tops, {"type": "length", "length": 0}, state.weight_version, prompt_tokens
            return
        while True:
            await state.paused.wait()
            async with state.lock:
                if run.aborted:
                    break
                if state.forward_sleep_time:
                    await asyncio.sleep(state.forward_sleep_time)
                logprobs = await asyncio.to_thread(state.step, ids + out_ids)
                token = _sample(logprobs, sp, gen)
                out_ids.append(token)
                triples.append([float(logprobs[token]), token, None])
                if top_n:
                    values, idx = torch.topk(logprobs, top_n)
                    tops.append([[float(v), int(i), None] for v, i in zip(values, idx)])
                finish = None
                if token in stops:
                    finish = {"type": "stop", "matched": token}
                elif len(out_ids) >= max_new:
                    finish = {"type": "length", "length": max_new}
                if finish is not None:
                    state.running.pop(run.rid, None)  # done: a weight update no longer waits for it
                version = state.weight_version  # read when the chunk is sent, as SGLang's tokenizer manager does
            yield out_ids, triples, tops, finish, version, prompt_tokens
            if finish is not None:
                return
        state.running.pop(run.rid, None)
        yield out_ids, triples, tops, ABORTED, state.weight_version, prompt_tokens

    def chunk(body: dict, rid: str, out_ids, triples, tops, finish, version, prompt_tokens) -> dict:
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": finish, "prompt_tokens": prompt_tokens, "weight_version": version,
            "completion_tokens": len(out_ids), "cached_tokens": 0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = list(triples)
            meta["input_token_logprobs"] = []
            if body.get("top_logprobs_num"):
                meta["output_top_logprobs"] = list(tops)
        return {"text": "", "output_ids": list(out_ids), "meta_info": meta}

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return _error("the body is not JSON")
        problem = _check(body) if isinstance(body, dict) else "the body must be a JSON object"
        if problem:
            return _error(problem)
        rid = str(body.get("rid") or f"standin-{id(body)}")
        if rid in state.running:
            return _error(f"Duplicate request ID: {rid}")
        while state.updating:  # a weight update holds the model-update lock: new requests wait for it
            await asyncio.sleep(0.005)
        run = _Running(rid)
        state.running[rid] = run

        if not body.get("stream"):
            try:
                last = None
                async for step in generate_tokens(body, run):
                    last = step
                return chunk(body, rid, *last)
            finally:
                state.running.pop(rid, None)

        async def events():
            try:
                async for step in generate_tokens(body, run):
                    yield b"data: " + json.dumps(chunk(body, rid, *step)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:  # a client that went away: its request is aborted (http_server's create_abort_task)
                run.aborted = True
                state.running.pop(rid, None)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await request.json()
        path = body.get("model_path")
        if not path:
            return _error("model_path is required")
        state.updating = True
        try:
            if state.paused.is_set():  # not paused: the writer lock waits for running requests
                while state.running:
                    await asyncio.sleep(0.005)
            async with state.lock:
                try:
                    await asyncio.to_thread(state.load, str(path))
                except Exception as exc:  # SGLang reloads the weights it served, from its model_path on disk,
                    # and answers success false (model_runner.update_weights_from_disk); that reload failing too
                    # leaves it without a model
                    try:
                        await asyncio.to_thread(state.load, state.model_path)
                    except Exception as lost:
                        state.model = None
                        return _error(f"Failed to update weights: {exc}; rolling back to {state.model_path} failed: {lost}", 500)
                    return JSONResponse({"success": False, "num_paused_requests": 0,
                                         "message": f"Failed to get weights iterator: {exc}. Rolling back to original weights."},
                                        status_code=400)
                message = "Succeeded to update model weights."
                if body.get("weight_version") is not None:
                    state.weight_version = str(body["weight_version"])
                    message += f" Weight version updated to {state.weight_version}."
            if body.get("flush_cache", True) and state.running:  # SGLang asserts its flush succeeded
                return JSONResponse({"success": False, "message": "Cache flush failed after updating weights",
                                     "num_paused_requests": 0}, status_code=400)
            state.model_path = str(path)
            return {"success": True, "message": message, "num_paused_requests": 0}
        finally:
            state.updating = False

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        body = await request.json()
        if body.get("abort_all_requests"):
            for run in state.running.values():
                run.aborted = True
        state.weight_version = str(body.get("new_version", ""))
        return {"success": True, "message": f"Weight version updated to {state.weight_version}",
                "new_version": state.weight_version}

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": state.weight_version}

    @app.get("/get_model_info")
    async def get_model_info():
        return {"model_path": state.model_path, "tokenizer_path": tokenizer_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": state.weight_version}

    @app.get("/get_server_info")
    async def get_server_info():
        return {"model_path": state.model_path, "disable_radix_cache": state.disable_radix_cache,
                "weight_version": state.weight_version, "version": "standin"}

    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        return Response(status_code=200 if state.model is not None else 503)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        ok = not state.running
        return Response("Cache flushed.\n" if ok else "Cache not flushed: requests are running or waiting.\n",
                        status_code=200 if ok else 400)

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await _json(request)
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _error(f"Invalid mode: {mode!r}. Expected one of ['abort', 'retract', 'in_place'].")
        if mode == "abort":
            for run in state.running.values():
                run.aborted = True
        state.paused.clear()
        async with state.lock:  # the step in flight has finished
            pass
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        state.paused.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.api_route("/slow_down", methods=["GET", "POST"])
    async def slow_down(request: Request):
        # SlowDownReqInput: forward_sleep_time (seconds each forward sleeps; None: no sleep)
        state.forward_sleep_time = (await _json(request)).get("forward_sleep_time")
        return Response(status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await _json(request)
        for rid, run in state.running.items():
            if body.get("abort_all") or rid == body.get("rid"):
                run.aborted = True
        return Response(status_code=200)

    @app.api_route("/load_lora_adapter", methods=["POST"])
    async def load_lora_adapter(request: Request):
        body = await _json(request)
        return JSONResponse({"success": False, "error_message": f"LoRA is not enabled (stand-in): cannot load "
                             f"{body.get('lora_name')!r}", "loaded_adapters": {}}, status_code=400)

    @app.api_route("/unload_lora_adapter", methods=["POST"])
    async def unload_lora_adapter(request: Request):
        body = await _json(request)
        return JSONResponse({"success": False, "error_message": f"no adapter {body.get('lora_name')!r}",
                             "loaded_adapters": {}}, status_code=400)

    return app


async def _json(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    async def serve() -> None:
        state = StandIn(str(Path(args.model_path)), args.disable_radix_cache)
        state.paused.set()
        await asyncio.to_thread(state.load, state.model_path)
        config = uvicorn.Config(build_app(state, args.api_key), host=args.host, port=args.port, log_level="warning")
        await uvicorn.Server(config).serve()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
