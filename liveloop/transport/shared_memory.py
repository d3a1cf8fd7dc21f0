"""The `shared_memory` backend: tensors handed to a co-located engine in another process through POSIX
shared memory (/dev/shm), without touching disk.

Layout of one version (namespace `ns`, version `v`, a random `nonce` per attempt):

    ll_ns_v00000007_m               the manifest: MAGIC, then a JSON length and the JSON
    ll_ns_v00000007_<nonce>_0000    one data segment per `send` call, each tensor at a 64-byte aligned
    ll_ns_v00000007_<nonce>_0001    offset, its raw bytes in row-major order
    ...

The manifest lists every tensor (name, dtype, shape, segment, offset, bytes) and every data segment. It
is written at `finish`, its MAGIC last: a reader that finds no MAGIC sees an unfinished version
(HandleGone), never half of one. The nonce keeps a manifest from ever pointing at another attempt's
data (a version number is reused when an attempt failed before its row was recorded). Tensors that
share memory (tied embeddings) are stored once and listed under each name.

Lifetime: segments are not tied to the process that made them (Python's resource tracker would unlink
them when the learner dies, and with them the only copy of a version whose durable checkpoint is not
written yet). They go when: an update is aborted or fails (its own segments, at once); the sender
`init`s (every unfinished version of the namespace: what a crashed sender left); a version is
`release`d (its durable checkpoint exists); a receiver has loaded a newer version (`loaded`: older ones),
and its own when its durable checkpoint exists; or more than `keep_versions` finished versions exist
(the oldest). So at most `keep_versions` finished versions are alive, plus the one being sent.
A receiver's tensors are views into the shared memory (no copy until the engine's own); they are
valid inside `open`'s block only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
import _posixshmem
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import torch

from liveloop.server.engines.base import NamedTensors, WeightSource
from liveloop.transport.base import HandleGone, Receiver, Sender, TransportFailed, WeightHandle

MAGIC = b"LLWTMAN1"
_HEADER = struct.Struct("<8sQ")  # MAGIC, JSON length
_ALIGN = 64
SHM_DIR = Path("/dev/shm")

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
        torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
        torch.float8_e4m3fn, torch.float8_e5m2,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TransportFailed(f"shared_memory: dtype {dtype} is not supported")
    return name


def manifest_name(namespace: str, version: int) -> str:
    return f"ll_{namespace}_v{version:08d}_m"


def _data_name(namespace: str, version: int, nonce: str, index: int) -> str:
    return f"ll_{namespace}_v{version:08d}_{nonce}_{index:04d}"


def _segment_pattern(namespace: str) -> re.Pattern[str]:
    return re.compile(rf"ll_{re.escape(namespace)}_v(\d{{8}})_(m|[0-9a-f]{{8}}_\d{{4}})")


# -- segments not owned by the resource tracker ------------------------------------------------------
def _create(name: str, size: int) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
    _untrack(shm)
    return shm


def _attach(name: str) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(name=name)
    _untrack(shm)
    return shm


def _untrack(shm: shared_memory.SharedMemory) -> None:
    # Python < 3.13 registers every segment (created or attached) with the resource tracker, which
    # unlinks it when this process exits: a version's memory must outlive the learner that sent it
    # (and a receiver must not remove what it only read).
    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]


def unlink(name: str) -> bool:
    """Remove segment `name` (its memory goes once nobody maps it); whether it existed."""
    # not SharedMemory.unlink: it would tell the resource tracker about a segment it no longer tracks
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def _close(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.close()
    except BufferError:  # a tensor still views it: the mapping goes when that tensor does
        pass


def segments(namespace: str) -> dict[int, list[str]]:
    """This namespace's segments in /dev/shm, by version (empty where /dev/shm cannot be listed)."""
    pattern = _segment_pattern(namespace)
    found: dict[int, list[str]] = {}
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return found
    for name in names:
        m = pattern.fullmatch(name)
        if m:
            found.setdefault(int(m.group(1)), []).append(name)
    return found


def committed(namespace: str, version: int) -> bool:
    """Whether `version` has a finished manifest."""
    try:
        shm = _attach(manifest_name(namespace, version))
    except FileNotFoundError:
        return False
    try:
        return len(shm.buf) >= _HEADER.size and bytes(shm.buf[:8]) == MAGIC
    finally:
        _close(shm)


def remove_version(namespace: str, version: int) -> int:
    """Unlink every segment of `version` (the manifest first: readers stop finding it); how many went."""
    names = segments(namespace).get(version, [])
    names.sort(key=lambda n: not n.endswith("_m"))
    gone = sum(unlink(n) for n in names)
    if not names:  # /dev/shm not listable: at least the manifest and what it names
        gone += _remove_by_manifest(namespace, version)
    return gone


def _remove_by_manifest(namespace: str, version: int) -> int:
    try:
        manifest = _read_manifest(manifest_name(namespace, version))
    except HandleGone:
        return 0
    gone = unlink(manifest_name(namespace, version))
    return gone + sum(unlink(s["name"]) for s in manifest["segments"])


def _read_manifest(name: str) -> dict:
    return read_doc(name)


def write_doc(name: str, doc: dict) -> None:
    """A small JSON document in its own segment, its MAGIC written last (readers see all or nothing)."""
    body = json.dumps(doc).encode()
    shm = _create(name, _HEADER.size + len(body))
    try:
        shm.buf[_HEADER.size:_HEADER.size + len(body)] = body
        struct.pack_into("<Q", shm.buf, 8, len(body))
        shm.buf[:8] = MAGIC
    finally:
        _close(shm)


def read_doc(name: str) -> dict:
    """The document `write_doc` finished under `name`; HandleGone if it is missing or unfinished."""
    try:
        shm = _attach(name)
    except FileNotFoundError:
        raise HandleGone(f"shared_memory: {name} is gone") from None
    try:
        if len(shm.buf) < _HEADER.size:
            raise HandleGone(f"shared_memory: {name} is not a manifest")
        magic, length = _HEADER.unpack_from(shm.buf, 0)
        if magic != MAGIC or _HEADER.size + length > len(shm.buf):
            raise HandleGone(f"shared_memory: {name} was never finished")
        return json.loads(bytes(shm.buf[_HEADER.size:_HEADER.size + length]))
    finally:
        _close(shm)


def _free_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# -- sender ------------------------------------------------------------------------------------------
@dataclass
class _Update:
    nonce: str
    segments: list[dict]  # {"name", "size"}
    tensors: list[dict]  # {"name", "dtype", "shape", "segment", "offset", "nbytes"}
    created: list[str]  # every segment name created so far (for abort)


class SharedMemorySender(Sender):
    backend = "shared_memory"

    def __init__(self, namespace: str, keep_versions: int = 2):
        super().__init__()
        self.namespace = namespace
        self.keep_versions = keep_versions
        self._update: _Update | None = None

    def _init(self) -> None:
        # a sender that crashed mid-update left unfinished versions: nobody can ever read them
        for version in segments(self.namespace):
            if not committed(self.namespace, version):
                remove_version(self.namespace, version)

    def _start(self, version: int) -> None:
        # a failed earlier attempt at this number had no row, so nothing serves from it
        remove_version(self.namespace, version)
        self._update = _Update(secrets.token_hex(4), [], [], [])

    def _send(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        u = self._update
        assert u is not None
        layout: list[tuple[str, torch.Tensor, int]] = []  # name, tensor, offset
        placed: dict[tuple, int] = {}
        size = 0
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
            dtype_name(t.dtype)
            key = _memory_key(t)
            if key is not None and key in placed:
                layout.append((name, t, placed[key]))
                continue
            offset = size
            size = _aligned(size + t.numel() * t.element_size())
            if key is not None:
                placed[key] = offset
            layout.append((name, t, offset))
        free = _free_bytes()
        if free is not None and size > free:
            raise TransportFailed(f"shared_memory: {SHM_DIR} has {free} bytes free, this send needs {size}")
        seg_name = _data_name(self.namespace, version, u.nonce, len(u.segments))
        shm = _create(seg_name, size)
        u.created.append(seg_name)
        try:
            copied: set[int] = set()
            for name, t, offset in layout:
                nbytes = t.numel() * t.element_size()
                if nbytes and offset not in copied:
                    dst = torch.frombuffer(shm.buf, dtype=torch.uint8, count=nbytes, offset=offset)
                    dst.view(t.dtype).view(t.shape).copy_(t.detach())  # any layout or device: one pass
                    del dst
                    copied.add(offset)
                u.tensors.append({
                    "name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                    "segment": len(u.segments), "offset": offset, "nbytes": nbytes,
                })
        finally:
            _close(shm)
        u.segments.append({"name": seg_name, "size": max(size, 1)})

    def _finish(self, version: int) -> WeightHandle:
        u = self._update
        assert u is not None
        name = manifest_name(self.namespace, version)
        u.created.append(name)
        write_doc(name, {"version": version, "nonce": u.nonce, "segments": u.segments, "tensors": u.tensors})
        self._update = None
        self._keep_newest()
        return WeightHandle(self.backend, version, name, {"segments": len(u.segments), "tensors": len(u.tensors)})

    def _abort(self, version: int) -> None:
        u, self._update = self._update, None
        if u is not None:
            for name in reversed(u.created):  # the manifest (if any) first
                unlink(name)

    def release(self, version: int) -> None:
        remove_version(self.namespace, version)

    def _keep_newest(self) -> None:
        finished = sorted(v for v in segments(self.namespace) if committed(self.namespace, v))
        for version in finished[: max(0, len(finished) - self.keep_versions)]:
            remove_version(self.namespace, version)


def _memory_key(t: torch.Tensor) -> tuple | None:
    if t.numel() == 0:
        return None
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


# -- receiver ----------------------------------------------------------------------------------------
class SharedMemoryReceiver(Receiver):
    backend = "shared_memory"

    def __init__(self, namespace: str):
        self.namespace = namespace

    def handle_for(self, version: int, checkpoint_path: str | None = None) -> WeightHandle:
        return WeightHandle(self.backend, version, manifest_name(self.namespace, version))

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        manifest = _read_manifest(handle.location)
        if manifest.get("version") != handle.version:
            raise HandleGone(f"shared_memory: {handle.location} holds version {manifest.get('version')}, not {handle.version}")
        mapped: list[shared_memory.SharedMemory] = []
        try:
            for s in manifest["segments"]:
                try:
                    shm = _attach(s["name"])
                except FileNotFoundError:
                    raise HandleGone(f"shared_memory: version {handle.version}'s segment {s['name']} is gone") from None
                mapped.append(shm)
                if len(shm.buf) < s["size"]:
                    raise HandleGone(f"shared_memory: segment {s['name']} is shorter than its manifest says")
            tensors = {t["name"]: _view(mapped[t["segment"]], t) for t in manifest["tensors"]}
            yield NamedTensors(tensors)
            del tensors
        finally:
            for shm in mapped:
                _close(shm)

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        with self.open(handle) as source:
            assert isinstance(source, NamedTensors)
            return {k: v.clone() for k, v in source.tensors.items()}

    def loaded(self, handle: WeightHandle, durable: bool) -> None:
        for version in segments(self.namespace):
            if version < handle.version or (version == handle.version and durable):
                remove_version(self.namespace, version)


def _view(shm: shared_memory.SharedMemory, t: dict) -> torch.Tensor:
    dtype, shape = _DTYPES[t["dtype"]], tuple(t["shape"])
    if t["nbytes"] == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(shm.buf, dtype=torch.uint8, count=t["nbytes"], offset=t["offset"])
    return flat.view(dtype).view(shape)
