"""Hot swap under load: new weights go live while 16 requests stream. No request fails, each
response records exactly one version, and every logged logprob is exactly what that version's
weights give (so no token was produced by new weights over an old KV cache)."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from liveloop.devtools import perturbed_checkpoint

from .conftest import ADMIN_KEY, USER_KEY, Reference, open_store, start_server, stop_server

N_STREAMS = 16


@pytest.fixture(scope="module")
def swap_server(tmp_path_factory, model_dir):
    server = start_server(tmp_path_factory.mktemp("swap-server"), model_dir, "vllm")
    yield server
    stop_server(server)


async def _stream_one(client: httpx.AsyncClient, i: int, first_token: asyncio.Event) -> dict:
    body = {
        "model": "liveloop-tiny",
        "messages": [{"role": "user", "content": f"Tell me about the sea, please ({i})."}],
        "max_tokens": 96,
        "stream": True,
        "seed": i,
    }
    out = {"id": None, "text": "", "done": False, "header": None, "status": None}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        out["status"] = r.status_code
        out["header"] = int(r.headers.get("x-liveloop-policy-version", -1))
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                break
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            out["id"] = chunk["id"]
            for c in chunk["choices"]:
                out["text"] += c["delta"].get("content") or ""
                if c["delta"].get("content"):
                    first_token.set()
    return out


async def _run(server, new_dir):
    headers = {"Authorization": f"Bearer {USER_KEY}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=120) as client:
        first = asyncio.Event()
        streams = [asyncio.create_task(_stream_one(client, i, first)) for i in range(N_STREAMS)]
        await asyncio.wait_for(first.wait(), 60)
        swap = await client.post(
            "/admin/weights", json={"path": str(new_dir), "note": "test swap"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        results = await asyncio.gather(*streams)
        after = await asyncio.gather(*[_stream_one(client, 100 + i, asyncio.Event()) for i in range(4)])
    return swap, results, after


def test_swap_while_streaming(swap_server, model_dir, tmp_path):
    new_dir = perturbed_checkpoint(model_dir, tmp_path / "v1")
    swap, during, after = asyncio.run(_run(swap_server, new_dir))
    assert swap.status_code == 200, swap.text
    assert swap.json()["version"] == 1 and swap.json()["parent"] == 0
    for r in during + after:
        assert r["status"] == 200 and r["done"], r  # no request failed or was cut
    store = open_store(swap_server)
    refs = {0: Reference(model_dir), 1: Reference(new_dir)}
    versions = []
    for r in during + after:
        row = store.feedback.get_response(r["id"])
        assert row is not None and row.policy_version == r["header"]
        versions.append(row.policy_version)
        expected = refs[row.policy_version].logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
        other = refs[1 - row.policy_version].logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
        assert np.abs(row.behavior_logprobs - expected).max() < 1e-3, f"{r['id']} does not match its version"
        assert np.abs(row.behavior_logprobs - other).max() > 1e-3  # the two versions are distinguishable
    assert 0 in versions[:N_STREAMS], "streams admitted before the swap finish on the old version"
    assert all(v == 1 for v in versions[N_STREAMS:]), "requests after the swap are served by the new version"
    rows = {v.version: v for v in store.versions.list_versions()}
    assert rows[1].status == "serving" and rows[0].status == "retired" and rows[1].parent == 0
    assert rows[1].checkpoint_sha256
    store.close()


def test_failed_swap_keeps_serving_old_version(swap_server, tmp_path, model_dir):
    # weights the import's checks pass (the serving model's names and shapes) and the engine's load refuses
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, str(bad / "model.safetensors"))
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    before = httpx.get(swap_server.base_url + "/healthz", headers=headers).json()["policy_version"]
    r = httpx.post(swap_server.base_url + "/admin/weights", json={"path": str(bad)}, headers=headers, timeout=60)
    assert r.status_code == 400
    assert httpx.get(swap_server.base_url + "/healthz", headers=headers).json()["policy_version"] == before
    ok = httpx.post(
        swap_server.base_url + "/v1/chat/completions",
        json={"model": "liveloop-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        headers={"Authorization": f"Bearer {USER_KEY}"},
        timeout=60,
    )
    assert ok.status_code == 200 and ok.json()["policy_version"] == before
    store = open_store(swap_server)
    assert [v.status for v in store.versions.list_versions() if v.version > before] == ["failed"]
    # the engine still holds exactly the old version's weights (restored after the failed load)
    row = store.feedback.get_response(ok.json()["id"])
    ref = Reference(store.versions.get_version(before).checkpoint_path)
    expected = ref.logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
    assert np.abs(row.behavior_logprobs - expected).max() < 1e-3
    store.close()
