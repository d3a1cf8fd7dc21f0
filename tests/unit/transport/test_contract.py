"""The transport contract on every backend that runs here (checkpoint_dir, shared_memory): tensors
byte-identical after transfer (dtypes, bfloat16, 0-dim, empty, non-contiguous, tied), several sends per
version, an aborted or failed update publishes nothing and leaves nothing behind, a receiver in another
process reads the same bytes, and shared memory stays bounded and is cleaned up."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from liveloop.transport import (
    HandleGone, TransportConfig, TransportFailed, TransportMisuse, WeightHandle, byte_view, make_receiver, make_sender,
)
from liveloop.transport import private_dir
from liveloop.transport import shared_memory as shm

BACKENDS = ["checkpoint_dir", "shared_memory"]


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(16, 8, generator=g)
    return {
        "f32": torch.randn(4, 5, generator=g),
        "bf16": torch.randn(3, 7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(6, generator=g).to(torch.float16),
        "i64": torch.arange(-5, 5),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "transposed": torch.randn(5, 3, generator=g).t(),  # non-contiguous input
        "strided": torch.randn(8, 6, generator=g)[::2, 1::2],
        "embed.weight": emb,
        "lm_head.weight": emb,  # tied: the same memory under two names
        "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
    }


def pair(backend: str, tmp_path: Path, namespace: str, keep: int = 2):
    config = TransportConfig(backend=backend, namespace=namespace, keep_versions=keep)
    sender = make_sender(config, path_for=lambda v: tmp_path / f"v{v:06d}" / "policy")
    return sender, make_receiver(config)


def send(sender, version: int, state: dict[str, torch.Tensor], chunks: int = 1):
    sender.start_update(version)
    items = list(state.items())
    for i in range(chunks):
        sender.send(dict(items[i::chunks]))
    return sender.finish()


def assert_identical(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for name, t in expected.items():
        assert got[name].dtype == t.dtype, name
        assert got[name].shape == t.shape, name
        assert torch.equal(byte_view(got[name]), byte_view(t)), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", [1, 3])
def test_tensors_arrive_byte_identical(backend, chunks, tmp_path, namespace):
    sender, receiver = pair(backend, tmp_path, namespace)
    state = weights()
    handle = send(sender, 7, state, chunks)
    assert handle.version == 7 and handle.backend == backend
    # what the server rebuilds from the version's row (the learner recorded the handle's nonce and digest)
    location = handle.location if backend == "checkpoint_dir" else None
    rebuilt = receiver.handle_for(7, location, nonce=handle.nonce, digest=handle.digest)
    assert (rebuilt.location, rebuilt.nonce, rebuilt.digest) == (handle.location, handle.nonce, handle.digest)
    assert_identical(state, receiver.tensors(rebuilt))


def test_shared_memory_source_is_the_bytes_without_copies(tmp_path, namespace):
    sender, receiver = pair("shared_memory", tmp_path, namespace)
    state = weights()
    handle = send(sender, 1, state)
    with receiver.open(handle) as source:
        assert_identical(state, dict(source.tensors))
        # tied names share one stored copy
        assert source.tensors["embed.weight"].data_ptr() == source.tensors["lm_head.weight"].data_ptr()


def test_shared_memory_source_says_where_its_bytes_lie_for_another_process_to_map(tmp_path, namespace):
    """The layout a co-located engine maps instead of copying (vLLM's worker: vllm_worker.read_shared):
    the same bytes, and only from the very files verified: one put at a file's path since is refused."""
    from liveloop.server.engines.vllm.worker import SharedWeights, WeightsMoved, read_shared

    sender, receiver = pair("shared_memory", tmp_path, namespace)
    state = weights()
    handle = send(sender, 1, state, chunks=3)
    with receiver.open(handle) as source:
        assert source.layout is not None and len(source.layout.files) == 3
        shared = SharedWeights.of_transport(source)
        assert shared is not None and not shared.owned
        with read_shared(shared.wire()) as views:
            assert_identical(state, dict(views))
            del views
        shared.release()  # the transport's files: not the engine's to remove
        assert all(Path(f.path).exists() for f in source.layout.files)
        first = Path(source.layout.files[0].path)
        data = first.read_bytes()
        first.unlink()  # the server's mapping keeps the verified bytes; the path now names nothing
        with pytest.raises(WeightsMoved):
            read_shared(shared.wire()).__enter__()
        first.write_bytes(data)  # the same bytes in another file at that path: not the one verified
        first.chmod(0o600)
        with pytest.raises(WeightsMoved, match="not the file the engine named"):
            read_shared(shared.wire()).__enter__()
        assert_identical(state, dict(source.tensors))  # the server's own views are untouched


@pytest.mark.parametrize("backend", BACKENDS)
def test_abort_publishes_nothing_and_leaves_nothing(backend, tmp_path, namespace):
    sender, receiver = pair(backend, tmp_path, namespace)
    sender.start_update(3)
    sender.send(weights())
    sender.abort()
    assert sender.updating is None
    with pytest.raises(HandleGone):
        receiver.tensors(receiver.handle_for(3, str(tmp_path / "v000003" / "policy")))
    assert shm.segments(namespace) == {}
    assert not any(tmp_path.rglob("*.safetensors"))
    # the sender is usable again, at the same version number
    assert_identical({"x": torch.ones(2)}, receiver.tensors(send(sender, 3, {"x": torch.ones(2)})))


@pytest.mark.parametrize("backend", BACKENDS)
def test_failed_send_aborts_the_whole_update(backend, tmp_path, namespace):
    sender, receiver = pair(backend, tmp_path, namespace)
    sender.start_update(4)
    sender.send({"ok": torch.ones(3)})
    with pytest.raises(TransportFailed):
        sender.send({"bad": torch.zeros(2, dtype=torch.uint16) if backend == "shared_memory" else "not a tensor"})
    assert sender.updating is None
    with pytest.raises(TransportMisuse):
        sender.finish()  # nothing to finish: the version was never published
    with pytest.raises(HandleGone):
        receiver.tensors(receiver.handle_for(4, str(tmp_path / "v000004" / "policy")))
    assert shm.segments(namespace) == {}
    assert not any(tmp_path.rglob("*.safetensors"))


def test_failed_finish_publishes_nothing(tmp_path, namespace):
    sender, receiver = pair("shared_memory", tmp_path, namespace)
    sender.start_update(5)
    sender.send(weights())
    # the manifest cannot be created: its name is taken (by a half-written segment, say)
    private_dir.close(private_dir.create(Path(shm.manifest_name(namespace, 5)), 4))
    with pytest.raises(TransportFailed):
        sender.finish()
    assert sender.updating is None
    assert shm.segments(namespace) == {}
    with pytest.raises(HandleGone):
        receiver.tensors(receiver.handle_for(5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_calls_out_of_order_are_refused(backend, tmp_path, namespace):
    sender, _ = pair(backend, tmp_path, namespace)
    with pytest.raises(TransportMisuse):
        sender.send({"x": torch.ones(1)})
    sender.start_update(1)
    with pytest.raises(TransportMisuse):
        sender.start_update(2)
    sender.abort()


def test_unfinished_version_is_invisible_and_swept_by_the_next_sender(tmp_path, namespace):
    crashed, receiver = pair("shared_memory", tmp_path, namespace)
    crashed.start_update(9)
    crashed.send(weights())  # the learner dies here: data segments, no manifest
    assert 9 in shm.segments(namespace)
    with pytest.raises(HandleGone):
        receiver.tensors(receiver.handle_for(9))
    fresh, _ = pair("shared_memory", tmp_path, namespace)
    fresh.init()
    assert shm.segments(namespace) == {}


def test_at_most_keep_versions_alive_and_cleaned_after_load(tmp_path, namespace):
    sender, receiver = pair("shared_memory", tmp_path, namespace, keep=2)
    for v in range(1, 6):
        handle = send(sender, v, {"w": torch.full((4,), float(v))}, chunks=1)
        assert len(shm.segments(namespace)) <= 2
    assert sorted(shm.segments(namespace)) == [4, 5]
    # loaded without a durable checkpoint yet: older versions go, its own memory stays
    receiver.loaded(receiver.handle_for(5), durable=False)
    assert sorted(shm.segments(namespace)) == [5]
    assert torch.equal(receiver.tensors(handle)["w"], torch.full((4,), 5.0))
    sender.release(5)  # the learner wrote its durable checkpoint
    assert shm.segments(namespace) == {}


def test_memory_outlives_the_process_that_sent_it(tmp_path, namespace):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_send_in_child, args=(namespace, 11, out))
    p.start()
    handle = WeightHandle.from_json(out.get(timeout=120))
    p.join(120)
    assert p.exitcode == 0
    _, receiver = pair("shared_memory", tmp_path, namespace)
    assert_identical(weights(), receiver.tensors(receiver.handle_for(11, nonce=handle.nonce, digest=handle.digest)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_receiver_in_another_process_reads_the_same_bytes(backend, tmp_path, namespace):
    sender, _ = pair(backend, tmp_path, namespace)
    handle = send(sender, 2, weights(), chunks=2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_digest_in_child, args=(backend, namespace, handle.to_json(), out))
    p.start()
    digests = out.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0
    assert digests == _digests(weights())
    if backend == "shared_memory":  # the child only read: the version is still there
        assert 2 in shm.segments(namespace)


def _digests(state: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {k: (str(t.dtype), tuple(t.shape), bytes(byte_view(t).numpy())) for k, t in state.items()}


def _digest_in_child(backend: str, namespace: str, handle_json: str, out) -> None:
    from liveloop.transport import WeightHandle

    torch.set_num_threads(1)
    receiver = make_receiver(TransportConfig(backend=backend, namespace=namespace))
    out.put(_digests(receiver.tensors(WeightHandle.from_json(handle_json))))


def _send_in_child(namespace: str, version: int, out) -> None:
    torch.set_num_threads(1)
    sender = make_sender(TransportConfig(backend="shared_memory", namespace=namespace))
    out.put(send(sender, version, weights()).to_json())
