"""`keep` swaps through the real server on the hf engine: two new versions go live while streams run
(official `openai` client). Running responses continue under the new weights, and each one says
which version sampled which tokens: the spans in its last chunk and in its store row are the same,
and token by token every logged logprob is exactly what the weights of that token's version give
over the whole context (the KV was recomputed: never old KV under new weights). No token a client
received before a swap was asked for can carry that swap's version."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest

from liveloop.devtools import perturbed_checkpoint

from .conftest import ADMIN_KEY, USER_KEY, Reference, open_store, start_server, stop_server

MODEL = "liveloop-tiny"
N_STREAMS = 6


@pytest.fixture(scope="module")
def keep_server(tmp_path_factory, model_dir):
    server = start_server(tmp_path_factory.mktemp("keep-server"), model_dir, "hf", engine_extra='swap_mode = "keep"')
    yield server
    stop_server(server)


async def _stream(oai: openai.AsyncOpenAI, i: int, started: asyncio.Event) -> dict:
    stream = await oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Tell me a long story about the sea ({i})."}],
        max_tokens=160,
        seed=i,
        stream=True,
        logprobs=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},  # 160 tokens each: a reply that ended early crosses no swap
    )
    out: dict = {"id": None, "tokens": [], "logprobs": [], "arrived": [], "spans": None, "version": None}
    async for chunk in stream:
        out["id"], out["version"] = chunk.id, chunk.model_extra["policy_version"]
        for c in chunk.choices:
            ids = (c.model_extra or {}).get("token_ids") or []
            out["tokens"] += ids
            out["logprobs"] += [e.logprob for e in (c.logprobs.content if c.logprobs else [])]
            out["arrived"] += [time.monotonic()] * len(ids)
            if ids:
                started.set()
            if c.finish_reason:
                out["spans"] = chunk.model_extra["version_spans"]
    return out


async def _swap(base_url: str, path) -> tuple[float, dict]:
    asked = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120) as c:
        r = await c.post("/admin/weights", json={"path": str(path), "note": "keep swap"})
    assert r.status_code == 200, r.text
    return asked, r.json()


async def _run(server, v1, v2):
    """Streams start every 0.1 s, from before the first swap until after the second, so whenever a
    swap lands some stream is running."""
    oai = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0, timeout=120)
    started, swapping = asyncio.Event(), True
    streams = [asyncio.create_task(_stream(oai, i, started)) for i in range(N_STREAMS)]

    async def feed() -> None:
        while swapping:
            await asyncio.sleep(0.1)
            streams.append(asyncio.create_task(_stream(oai, len(streams), started)))

    feeder = asyncio.create_task(feed())
    await asyncio.wait_for(started.wait(), 60)
    swaps = [await _swap(server.base_url, v1), await _swap(server.base_url, v2)]
    swapping = False
    await feeder
    results = await asyncio.gather(*streams)
    await oai.close()
    return swaps, results


def _token_versions(spans: list[dict], n: int) -> list[int]:
    out = []
    for at, s in enumerate(spans):
        assert s["start"] == (spans[at - 1]["end"] if at else 0) and s["end"] > s["start"], spans
        out += [s["version"]] * (s["end"] - s["start"])
    assert len(out) == n, "the spans cover the response exactly"
    return out


def test_keep_swaps_record_true_version_spans(keep_server, model_dir, tmp_path):
    v1 = perturbed_checkpoint(model_dir, tmp_path / "v1", seed=1, scale=0.1)
    v2 = perturbed_checkpoint(model_dir, tmp_path / "v2", seed=2, scale=0.1)
    swaps, results = asyncio.run(_run(keep_server, v1, v2))
    assert [s[1]["version"] for s in swaps] == [1, 2]
    refs = {0: Reference(model_dir), 1: Reference(v1), 2: Reference(v2)}
    store = open_store(keep_server)
    mixed = told_apart = 0
    for r in results:
        n = len(r["tokens"])
        assert n == len(r["logprobs"]) > 0
        versions = _token_versions(r["spans"], n)
        assert versions[0] >= r["version"] and versions == sorted(versions), "versions only move forward"
        # the store row says the same, and the same tokens and logprobs
        row = store.feedback.get_response(r["id"])
        assert row.response_ids.tolist() == r["tokens"] and row.policy_version == r["version"]
        assert np.allclose(row.behavior_logprobs, r["logprobs"], atol=1e-6)
        spans = tuple((s["start"], s["end"], s["version"]) for s in r["spans"])
        assert row.version_spans == (None if set(versions) == {r["version"]} else spans)
        mixed += len(spans) > 1
        # token by token: the logged logprob is that token's version's, over the whole context
        prompt, tokens = row.prompt_ids.tolist(), row.response_ids.tolist()
        by_version = {v: ref.logprobs(prompt, tokens).numpy() for v, ref in refs.items()}
        for t, v in enumerate(versions):
            assert abs(row.behavior_logprobs[t] - by_version[v][t]) < 1e-3, f"{r['id']} token {t}: not version {v}'s"
        # tokens of a newer version where the admitted version's weights give another logprob: there
        # the match above tells the versions apart (near-certain tokens may agree under both)
        for start, end, v in spans:
            if v != r["version"]:
                told_apart += int((np.abs(by_version[v][start:end] - by_version[r["version"]][start:end]) > 1e-2).sum())
        # what the client had before a swap was asked for cannot have been sampled by that swap's version
        for asked, swap in swaps:
            early = [v for v, at in zip(versions, r["arrived"]) if at < asked]
            assert all(v < swap["version"] for v in early), (r["id"], swap["version"])
    assert mixed > 0 and told_apart > 0, "some response must have continued across a swap, or this test shows nothing"
    store.close()
