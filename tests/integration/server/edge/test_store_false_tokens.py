"""`[server] store_false = "tokens"` against a real server (`build_app`: hf engine on the tiny model,
SQLite, under uvicorn on 127.0.0.1): a `store: false` turn (what Codex CLI sends on every turn) is
logged for training, its tokens and logprobs kept, its session linked and its rating taken, while no API
reads it back; the default (`"nothing"`) keeps no row at all."""

from __future__ import annotations


import httpx
import pytest

from liveloop.devtools import USER_KEY

from ..conftest import served_app

MODEL = "liveloop-tiny"
CODEX = {"session-id": "codex-unstored", "thread-id": "codex-unstored"}  # Codex CLI's headers: one thread, one episode


@pytest.fixture(scope="module")
def servers(tmp_path_factory, model_dir):
    with served_app(tmp_path_factory.mktemp("tokens"), model_dir, 'store_false = "tokens"') as tokens, \
            served_app(tmp_path_factory.mktemp("nothing"), model_dir) as nothing:
        yield {"tokens": tokens, "nothing": nothing}


def _turn(base: str, text: str) -> dict:
    body = {"model": MODEL, "input": [{"role": "user", "content": text}], "store": False, "max_output_tokens": 8, "seed": 1}
    r = httpx.post(f"{base}/v1/responses", json=body, headers={"authorization": f"Bearer {USER_KEY}", **CODEX}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_unstored_turn_trains_and_is_not_read_back(servers):
    base, store = servers["tokens"]
    auth = {"authorization": f"Bearer {USER_KEY}"}
    first = _turn(base, "List the files here.")
    second = _turn(base, "And now the hidden ones.")
    row = store.feedback.get_response(second["id"])
    assert row is not None and len(row.response_ids) == second["usage"]["output_tokens"] == len(row.behavior_logprobs)
    assert len(row.prompt_ids) == second["usage"]["input_tokens"]
    # no API reads its text back: not by id, not its input items, not as a conversation to continue
    assert httpx.get(f"{base}/v1/responses/{second['id']}", headers=auth).status_code == 404
    assert httpx.get(f"{base}/v1/responses/{second['id']}/input_items", headers=auth).status_code == 404
    follow = {"model": MODEL, "input": "go on", "previous_response_id": second["id"], "max_output_tokens": 4}
    assert httpx.post(f"{base}/v1/responses", json=follow, headers=auth, timeout=60).status_code == 400
    # one Codex thread, one episode: the second turn continues the first; a rating of the session takes
    assert store.feedback.get_response(second["id"]).parent_id == first["id"]
    rated = httpx.post(f"{base}/v1/feedback", json={"session_id": "codex-unstored", "reward": 1}, headers=auth, timeout=60)
    assert rated.status_code == 200, rated.text
    assert rated.json()["response_id"] == second["id"]


def test_by_default_an_unstored_turn_leaves_no_row(servers):
    base, store = servers["nothing"]
    turn = _turn(base, "List the files here.")
    assert store.feedback.get_response(turn["id"]) is None
