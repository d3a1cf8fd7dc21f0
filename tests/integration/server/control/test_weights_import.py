"""`POST /admin/weights` over the real application (`build_app`: transformers engine on the tiny model,
SQLite, the writer, the version watcher): the operator's directory is copied into the learner's
checkpoint_dir under the version's own name and checked before it can serve, so

  - a directory with only model.safetensors serves from a complete copy, its digest in the row;
  - a symlink, a FIFO (never opened: the request does not hang), more than max_import_bytes, or tensors
    of another shape are 400s with a code on `path`, and leave no row and nothing half-written;
  - deleting the operator's directory afterwards changes nothing: a restart serves the imported version
    and a rollback to it loads it;
  - it is the learner's lineage: an in-process learner on the same store reloads it, publishes versions
    that descend from it (never on top of what it trained before the import), and its retention prunes
    an unpinned import but never a pinned one."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from liveloop.app import build_app
from liveloop.checkpoint import checkpoint_digest
from liveloop.config import load_config
from liveloop.critic.config import CriticConfig
from liveloop.devtools import ADMIN_KEY, USER_KEY, free_port, wait_until, write_config
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.store import FeedbackRecord, ResponseRecord

MONITOR = "[monitor]\nenabled = false\n"
SWAP_KEYS = ["object", "version", "parent", "swap_ms", "held_ms", "checkpoint_sha256", "completed", "left_behind"]


@contextlib.contextmanager
def serving(work: Path, model_dir: Path) -> Iterator[TestClient]:
    """The application on `work`'s config (written on first use: its store and checkpoint_dir stay)."""
    config = work / "config.toml"
    if not config.exists():
        write_config(work, Path(model_dir).resolve(), "hf", free_port(), extra=MONITOR)
    loaded = load_config(config)
    base_url = f"http://127.0.0.1:{loaded.server.port}"  # a Host the server answers to
    with TestClient(build_app(loaded, Path(model_dir)), base_url=base_url, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


@pytest.fixture(scope="module")
def client(tmp_path_factory, model_dir):
    with serving(tmp_path_factory.mktemp("weights-import"), model_dir) as c:
        yield c


def operator_checkpoint(model_dir: Path, where: Path, seed: int) -> Path:
    """Only model.safetensors: the serving model's tensors moved by noise (what an operator trained)."""
    where.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    moved = {k: v + 0.05 * v.std().clamp(min=1e-3) * torch.randn(v.shape, generator=g) for k, v in tensors.items()}
    save_file(moved, str(where / "model.safetensors"), metadata={"format": "pt"})
    return where


def managed(client: TestClient) -> Path:
    """The learner's checkpoint_dir, where imports are copied."""
    return client.app.state.server.operations.imports.checkpoint_dir


def versions(client: TestClient) -> dict[int, str]:
    return {v["version"]: v["status"] for v in client.get("/admin/versions").json()["data"]}


def serving_version(client: TestClient) -> int:
    return client.get("/admin/stats").json()["serving"]


def chat(client: TestClient) -> dict:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {USER_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_only_model_safetensors_serves_from_a_complete_managed_copy(client, model_dir, tmp_path):
    source = operator_checkpoint(model_dir, tmp_path / "operator", seed=1)
    r = client.post("/admin/weights", json={"path": str(source), "note": "only weights"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == SWAP_KEYS
    version = body["version"]
    assert serving_version(client) == version and versions(client)[version] == "serving"
    assert set(body["completed"]) == {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}

    record = client.app.state.server.store.versions.get_version(version)
    copy = managed(client) / f"v{version:06d}" / "policy"
    assert record.checkpoint_path == str(copy) and copy.is_dir()
    # the digest covers the completed copy's config and tokenizer too, not the operator's weights alone
    assert record.checkpoint_sha256 == body["checkpoint_sha256"] == checkpoint_digest(copy) != checkpoint_digest(source)
    assert (copy / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    assert not list(managed(client).glob(".staging-*"))
    event = [e for e in client.get("/admin/events").json()["data"] if e["kind"] == "weights_imported"][-1]
    assert event["version"] == version and event["detail"]["source"] == str(source)

    # the operator's directory goes: serving, and loading it again, read the copy
    shutil.rmtree(source)
    assert chat(client)["choices"]
    assert client.post("/admin/rollback", json={"version": 0}).status_code == 200
    assert client.post("/admin/rollback", json={"version": version}).status_code == 200
    assert serving_version(client) == version


def _symlink(model_dir: Path, where: Path) -> Path:
    operator_checkpoint(model_dir, where, seed=2)
    (where / "config.json").symlink_to(Path(model_dir) / "config.json")
    return where


def _fifo(model_dir: Path, where: Path) -> Path:
    operator_checkpoint(model_dir, where, seed=2)
    os.mkfifo(where / "config.json")  # opened for reading, it would block until a writer came
    return where


def _oversize(model_dir: Path, where: Path) -> Path:
    operator_checkpoint(model_dir, where, seed=2)
    with (where / "tokenizer.json").open("wb") as f:
        f.truncate(65 << 30)  # sparse: past the 64 GiB default without the disk
    return where


def _wrong_shape(model_dir: Path, where: Path) -> Path:
    where.mkdir(parents=True)
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:-1].contiguous()  # one token fewer
    save_file(tensors, str(where / "model.safetensors"), metadata={"format": "pt"})
    return where


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "make, code, says",
    [
        (_symlink, "not_a_regular_file", "config.json is a symlink"),
        (_fifo, "not_a_regular_file", "config.json is a FIFO"),
        (_oversize, "checkpoint_too_large", "server.max_import_bytes is 68719476736"),
        (_wrong_shape, "tensor_mismatch", "model.embed_tokens.weight is [1023, 64]"),
    ],
    ids=["symlink", "fifo", "oversize", "wrong-shape"],
)
def test_a_refused_import_leaves_no_row_and_nothing_half_written(client, model_dir, tmp_path, make, code, says):
    before, serving_before = versions(client), serving_version(client)
    source = make(model_dir, tmp_path / "operator")
    r = client.post("/admin/weights", json={"path": str(source)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "path", code)
    assert says in error["message"]
    assert versions(client) == before and serving_version(client) == serving_before
    assert not list(managed(client).glob(".staging-*"))
    assert sorted(p.name for p in managed(client).glob("v*")) == [f"v{v:06d}" for v, status in sorted(before.items()) if v > 0 and status != "failed"]


def test_weights_the_engine_refuses_leave_a_failed_row_and_no_copy(client, model_dir, tmp_path):
    """Past the import's checks, the engine's load is the last one (here: non-finite values): the row is
    FAILED (it never served), its copy deleted and marked pruned, the old version still serving."""
    serving_before = serving_version(client)
    source = tmp_path / "nan"
    source.mkdir()
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, str(source / "model.safetensors"))
    r = client.post("/admin/weights", json={"path": str(source)})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(f"could not load {source}: ")
    failed = max(versions(client))
    record = client.app.state.server.store.versions.get_version(failed)
    assert record.status == "failed" and record.pruned_at is not None
    assert not (managed(client) / f"v{failed:06d}").exists() and not list(managed(client).glob(".staging-*"))
    assert serving_version(client) == serving_before


def test_a_restart_and_a_rollback_need_not_the_operators_directory(tmp_path, model_dir):
    work = tmp_path / "server"
    work.mkdir()
    source = operator_checkpoint(model_dir, tmp_path / "operator", seed=3)
    with serving(work, model_dir) as client:
        r = client.post("/admin/weights", json={"path": str(source)})
        assert r.status_code == 200, r.text
        version = r.json()["version"]
    shutil.rmtree(source)
    with serving(work, model_dir) as client:
        assert serving_version(client) == version and versions(client)[version] == "serving"
        assert chat(client)["choices"]
        assert client.post("/admin/rollback", json={"version": 0}).status_code == 200
        r = client.post("/admin/rollback", json={"version": version})
        assert r.status_code == 200, r.text
        assert serving_version(client) == version


def _rate(store, n: int, start: int) -> None:
    g = torch.Generator().manual_seed(start)
    for i in range(start, start + n):
        prompt, reply = torch.randint(5, 500, (6,), generator=g).tolist(), torch.randint(5, 500, (8,), generator=g).tolist()
        store.feedback.write_batch([ResponseRecord(f"r{i}", "k", "m", 0, "chat", tuple(prompt), tuple(reply), (-2.0,) * 8, "stop", 1.0, 1.0, 1.0)])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", "k", i % 2))


def _weights(path: str | Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(str(path)).state_dict()


def _import(client: TestClient, source: Path) -> int:
    r = client.post("/admin/weights", json={"path": str(source)})
    assert r.status_code == 200, r.text
    return r.json()["version"]


def test_the_learner_continues_from_an_import_and_retention_keeps_a_pinned_one(tmp_path, model_dir):
    work = tmp_path / "server"
    work.mkdir()
    with serving(work, model_dir) as client:
        store = client.app.state.server.store
        config = LearnerConfig(
            checkpoint_dir=str(managed(client)), publish_every_steps=2, publish_every_seconds=3600, poll_seconds=0.01,
            keep_last_versions=1, keep_parent_chain=0,
        )
        _rate(store, 16, 0)
        learner = OnlineLearner.resume(
            config, CriticConfig(), model_dir,
            feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
        )
        learner.step()
        learner.step()  # v1, which the server's watcher activates
        wait_until(lambda: serving_version(client) == 1, 30, "the learner's version 1 to serve")
        learner.step()  # trained on v1, not published

        unpinned = _import(client, operator_checkpoint(model_dir, tmp_path / "a", seed=4))
        assert learner.sync_with_store() is False and learner.state.version == unpinned
        pinned_source = operator_checkpoint(model_dir, tmp_path / "b", seed=5)
        pinned = _import(client, pinned_source)
        assert client.post(f"/admin/versions/{pinned}/pin").json()["changed"]
        shutil.rmtree(pinned_source)  # the operator's directory goes; the learner reads the copy

        learner.step()
        learner.step()  # its publish on `unpinned` is refused: it reloads the pinned import
        assert learner.state.version == pinned
        copy = managed(client) / f"v{pinned:06d}" / "policy"
        expected = _weights(copy)
        assert all(torch.equal(expected[k], v) for k, v in learner.policy.state_dict().items())

        learner.run(lambda: False, max_steps=learner.state.step + 6)  # three more versions on top of it
        rows = {r.version: r for r in store.versions.list_versions()}
        mine = [v for v in rows if v > pinned]
        assert len(mine) == 3 and rows[mine[0]].parent == pinned and all(rows[v].parent == v - 1 for v in mine[1:])
        # nothing published on the lineages the imports replaced
        assert [v for v, r in rows.items() if r.parent in (1, unpinned) and v not in (unpinned, pinned)] == []
        wait_until(lambda: serving_version(client) == mine[-1], 30, "the learner's newest version to serve")
        assert store.versions.get_version(pinned).status == "retired"  # served, then overtaken: not undone

        # retention (keep the newest 1, no parent chain) pruned the unpinned import and v1, never the pinned one
        assert store.versions.get_version(unpinned).pruned_at is not None and not (managed(client) / f"v{unpinned:06d}").exists()
        assert store.versions.get_version(1).pruned_at is not None
        assert store.versions.get_version(pinned).pruned_at is None and (copy / "model.safetensors").is_file()
        r = client.post("/admin/rollback", json={"version": pinned})
        assert r.status_code == 200, r.text
        assert serving_version(client) == pinned
