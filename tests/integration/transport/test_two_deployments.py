"""Two deployments on one machine, each a checkout with the DEFAULT config (`configs/serve/default.toml`: the
relative SQLite URL sqlite:///data/liveloop.db, shared-memory transport, namespace "auto") in its own
working directory, publish versions 1..N at the same time, under the same numbers. Each resolves its
own namespace from the random id its store's migration generated (the URL is the same string for
both), and each reads back every version it published, verified against its own rows: neither ever
sees the other's weights. Real SQLite, real /dev/shm, real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from pathlib import Path

import torch

from liveloop.transport import TransportConfig, make_receiver
from liveloop.transport import shared_memory as shm

VERSIONS = 10


def _deployment(workdir: str, fill: float, out) -> None:
    try:
        _publish_and_read_back(workdir, fill, out)
    except BaseException:
        out.put((workdir, None, traceback.format_exc()))
        raise


def _publish_and_read_back(workdir: str, fill: float, out) -> None:
    """One deployment's learner and server side, in its own working directory."""
    torch.set_num_threads(1)
    os.chdir(workdir)
    from liveloop.config import load_config
    from liveloop.store import Store, VersionStatus
    from liveloop.transport import make_sender

    config = load_config("default")  # the default preset, as `liveloop serve` in a fresh checkout
    assert config.store.url == "sqlite:///data/liveloop.db" and config.transport.namespace == "auto"
    config = config.with_section("transport", backend="shared_memory")  # (the default's fast path)
    store = Store(config.store)
    store.migrate()
    store.versions.ensure_base_version("/models/base")
    transport = config.transport_for_store()
    sender = make_sender(transport)
    receiver = make_receiver(transport)
    seen = []
    for version in range(1, VERSIONS + 1):
        weights = {"w": torch.full((256,), fill + version), "b": torch.arange(8) * version}
        sender.start_update(version)
        sender.send(weights)
        handle = sender.finish()
        record = store.versions.publish_version(
            version, parent=version - 1, checkpoint_path=f"data/checkpoints/v{version:06d}/policy", checkpoint_sha256=None,
            learner_step=version, samples_used=1, metrics={}, cursor_name="sao", last_feedback_id=0,
            weights_nonce=handle.nonce, weights_digest=handle.digest,
        )
        store.versions.activate_version(version)
        got = receiver.tensors(receiver.handle_of(store.versions.get_version(record.version)))  # verified against our row
        seen.append(float(got["w"][0]))
    assert store.versions.get_version(VERSIONS).status == VersionStatus.SERVING
    out.put((workdir, transport.namespace, seen))
    store.close()


def test_two_default_deployments_never_see_each_others_weights(tmp_path):
    dirs = [tmp_path / "checkout-a", tmp_path / "checkout-b"]
    for d in dirs:
        d.mkdir()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_deployment, args=(str(d), fill, out)) for d, fill in zip(dirs, (1000.0, 2000.0))]
    for p in procs:
        p.start()
    results = {workdir: (ns, seen) for workdir, ns, seen in (out.get(timeout=300) for _ in procs)}
    for ns, seen in results.values():
        assert ns is not None, seen  # the child's traceback
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (ns_a, seen_a), (ns_b, seen_b) = results[str(dirs[0])], results[str(dirs[1])]
    try:
        assert ns_a != ns_b  # the same relative URL, two random deployment ids
        assert all((Path(d) / "data" / "liveloop.db").exists() for d in dirs)
        assert seen_a == [1000.0 + v for v in range(1, VERSIONS + 1)]
        assert seen_b == [2000.0 + v for v in range(1, VERSIONS + 1)]
        # each deployment's memory sits in its own private directory
        assert shm.directory(ns_a) != shm.directory(ns_b)
        assert set(shm.segments(ns_a)) and set(shm.segments(ns_b))
    finally:
        for ns in (ns_a, ns_b):
            for version in shm.segments(ns):
                shm.remove_version(ns, version)
            os.rmdir(shm.directory(ns))


def test_a_namespace_is_resolved_from_the_store_not_from_its_url(tmp_path, monkeypatch):
    from liveloop.store import Store, StoreConfig

    monkeypatch.chdir(tmp_path)
    url = "sqlite:///data/liveloop.db"
    store = Store(StoreConfig(url=url))
    store.migrate()
    ident = store.fleet.deployment_id()
    store.close()
    resolved = TransportConfig(backend="shared_memory").for_deployment(url)
    assert resolved.namespace == f"d{ident[:15]}"
    assert TransportConfig(backend="shared_memory", namespace="mine").for_deployment(url).namespace == "mine"
