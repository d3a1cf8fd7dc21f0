"""The one table that maps domain exceptions to HTTP (server/edge/errors.py), through a real FastAPI app with
the server's handlers: every exception in the table answers its status, OpenAI-style body, code, param
and Retry-After; an exception the table does not name is a 500, never a silent 4xx."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import InterfaceError, OperationalError

from liveloop.server.edge.admission import Busy, RateLimited, StorageSpent
from liveloop.server.edge.errors import APIError, domain_error, domain_table, install_handlers
from liveloop.server.engines.base import AdaptersUnsupported, AdapterUnusable, EngineUnavailable
from liveloop.server.control.activator import AlreadyServing, CheckpointUnusable, NotServable, SwapFailed, UnknownSegment
from liveloop.server.edge.pipeline.grammar_check import CheckerUnavailable
from liveloop.server.edge.pipeline.serving import InvalidRequest, LogFailed, UnknownModel
from liveloop.server.edge.formats.tools import ToolsRefused
from liveloop.grammar import GrammarDeadEnd
from liveloop.server.control.weights_import import ImportFailed, ImportRefused, ImportTooLarge
from liveloop.store import RollbackRefused, ServingChanged, StaleLineage, TransitionRefused, VersionNotFound, WriterDown, WriterFull
from liveloop.store.rights import KeyNotFound

# exception -> (status, type, code, param, message, Retry-After)
EXPECTED = {
    RateLimited: (RateLimited("3 requests per minute", retry_after=7), 429, "rate_limit_error", "rate_limit_exceeded", None, "3 requests per minute", "7"),
    Busy: (Busy("too many generations running"), 429, "rate_limit_error", "too_many_concurrent_requests", None, "too many generations running", "1"),
    StorageSpent: (StorageSpent("stored 1024 MB today", retry_after=3600), 429, "rate_limit_error", "storage_budget_exceeded", None, "stored 1024 MB today", "3600"),
    WriterFull: (WriterFull("queue"), 503, "server_error", "log_queue_full", None, "the server is busy logging; please retry", "1"),
    WriterDown: (WriterDown("gone"), 503, "server_error", "log_unavailable", None, "the server cannot log responses right now; please retry", "5"),
    OperationalError: (OperationalError("SELECT 1", {}, Exception("down")), 503, "server_error", "store_unavailable", None,
                       "the store is unavailable; please retry", "5"),
    InterfaceError: (InterfaceError("SELECT 1", {}, Exception("closed")), 503, "server_error", "store_unavailable", None,
                     "the store is unavailable; please retry", "5"),
    LogFailed: (LogFailed("the response could not be logged; please retry"), 503, "server_error", "log_failed", None,
                "the response could not be logged; please retry", "1"),
    EngineUnavailable: (EngineUnavailable("the SGLang server at http://127.0.0.1:30000 does not answer"), 503, "server_error",
                        "engine_unavailable", None, "the SGLang server at http://127.0.0.1:30000 does not answer", "5"),
    CheckerUnavailable: (CheckerUnavailable("the server is stopping: the grammar checker is closed"), 503, "server_error",
                         "grammar_checker_unavailable", None, "the server is stopping: the grammar checker is closed", "1"),
    UnknownModel: (UnknownModel("gpt-9"), 404, "not_found_error", "model_not_found", "model", "the model `gpt-9` does not exist", None),
    InvalidRequest: (InvalidRequest("the prompt is empty", "prompt", code="context_length_exceeded"), 400, "invalid_request_error",
                     "context_length_exceeded", "prompt", "the prompt is empty", None),
    ToolsRefused: (ToolsRefused("tool_choice: `f` is not one of the tools offered", "tool_choice"), 400, "invalid_request_error",
                   "invalid_value", "tool_choice", "tool_choice: `f` is not one of the tools offered", None),
    GrammarDeadEnd: (GrammarDeadEnd("the constraint allows no token after 4 generated; it cannot be satisfied"), 400,
                     "invalid_request_error", "grammar_dead_end", "response_format",
                     "the constraint allows no token after 4 generated; it cannot be satisfied", None),
    CheckpointUnusable: (CheckpointUnusable("/x", "path: /x is not a checkpoint directory with *.safetensors"), 400, "invalid_request_error",
                         None, "path", "path: /x is not a checkpoint directory with *.safetensors", None),
    ImportRefused: (ImportRefused("/x", "path: /x/config.json is a FIFO; a checkpoint directory to import holds regular files only",
                                  "not_a_regular_file"), 400, "invalid_request_error", "not_a_regular_file", "path",
                    "path: /x/config.json is a FIFO; a checkpoint directory to import holds regular files only", None),
    ImportFailed: (ImportFailed("could not write /v/.staging-1-import-a/policy/model.safetensors: No space left on device"), 503,
                   "server_error", "import_failed", None, "could not write /v/.staging-1-import-a/policy/model.safetensors: No space left on device", "5"),
    VersionNotFound: (VersionNotFound("no policy version 9"), 404, "not_found_error", None, "version", "no policy version 9", None),
    KeyNotFound: (KeyNotFound("no API key k-unknown"), 404, "not_found_error", "key_not_found", "key_id", "no API key k-unknown", None),
    NotServable: (NotServable("version 3 cannot be served (status failed)"), 409, "conflict_error", None, "version",
                  "version 3 cannot be served (status failed)", None),
    AlreadyServing: (AlreadyServing("version 2 is already serving"), 409, "conflict_error", None, "version", "version 2 is already serving", None),
    SwapFailed: (SwapFailed(4, "could not load version 4: bad shape"), 409, "conflict_error", None, "version",
                 "could not load version 4: bad shape", None),
    RollbackRefused: (RollbackRefused("version 5 was pruned (its checkpoint is deleted)"), 409, "conflict_error", None, "version",
                      "version 5 was pruned (its checkpoint is deleted)", None),
    ServingChanged: (ServingChanged("version 4 no longer serves (now: v3)"), 409, "conflict_error", "serving_changed", "expect_serving",
                     "version 4 no longer serves (now: v3)", None),
    TransitionRefused: (TransitionRefused("version 7 is rolled_back: only a published or loading version is activated"), 409, "conflict_error",
                        None, "version", "version 7 is rolled_back: only a published or loading version is activated", None),
    UnknownSegment: (UnknownSegment("segment 'x' has no adapters here (segments: cozy)"), 404, "not_found_error", "segment_not_found",
                     "segment", "segment 'x' has no adapters here (segments: cozy)", None),
    AdapterUnusable: (AdapterUnusable("adapter rank 64 > max_lora_rank 16"), 409, "conflict_error", None, "version",
                      "adapter rank 64 > max_lora_rank 16", None),
    AdaptersUnsupported: (AdaptersUnsupported("vllm engine: no adapter support"), 409, "conflict_error", "adapters_unsupported", None,
                          "vllm engine: no adapter support", None),
}
UNMAPPED = [StaleLineage("lineage moved"), ValueError("a bug"), LookupError("a bug"), RuntimeError("a bug")]


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    install_handlers(app)
    raising: dict[str, BaseException] = {}

    @app.get("/raise/{name}")
    async def _raise(name: str):
        raise raising[name]

    app.state.raising = raising
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _answer(client: TestClient, exc: BaseException):
    name = f"{type(exc).__name__}-{id(exc)}"
    client.app.state.raising[name] = exc
    return client.get(f"/raise/{name}")


def test_every_exception_in_the_table_is_checked_here():
    assert {cls for cls, _ in domain_table()} == set(EXPECTED)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_domain_exception_answers_its_status_and_openai_body(client, cls):
    exc, status, kind, code, param, message, retry_after = EXPECTED[cls]
    r = _answer(client, exc)
    assert r.status_code == status
    assert r.json() == {"error": {"message": message, "type": kind, "param": param, "code": code}}
    assert r.headers.get("retry-after") == retry_after
    mapped = domain_error(exc)  # the same answer for a stream's error event (server/edge/pipeline/streaming.py)
    assert (mapped.status, mapped.message, mapped.code, mapped.param) == (status, message, code, param)


@pytest.mark.parametrize("exc", UNMAPPED, ids=lambda e: type(e).__name__)
def test_an_exception_the_table_does_not_name_is_a_500(client, exc):
    assert domain_error(exc) is None
    r = _answer(client, exc)
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "internal server error", "type": "server_error", "param": None, "code": None}}


def test_a_subclass_maps_like_its_parent_and_api_errors_pass_through(client):
    class Pruned(NotServable):
        pass

    r = _answer(client, Pruned("version 1's checkpoint was pruned"))
    assert (r.status_code, r.json()["error"]["param"]) == (409, "version")
    r = _answer(client, APIError(418, "short and stout", param="pot", code="teapot"))
    assert r.status_code == 418 and r.json()["error"] == {"message": "short and stout", "type": "invalid_request_error", "param": "pot", "code": "teapot"}


def test_an_import_too_large_is_a_400_with_its_own_code(client):
    r = _answer(client, ImportTooLarge("/x", "path: /x holds 70000000000 bytes of checkpoint files; server.max_import_bytes is 68719476736"))
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "path: /x holds 70000000000 bytes of checkpoint files; server.max_import_bytes is 68719476736",
        "type": "invalid_request_error", "param": "path", "code": "checkpoint_too_large",
    }
