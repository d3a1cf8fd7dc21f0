"""The `shared_memory` backend: tensors handed to a co-located engine in another process through shared
memory (/dev/shm), without touching disk.

Everything lives in the deployment's private directory (`private_dir`: /dev/shm/liveloop-<uid>/<ns>/,
0700, ours). One version `v`, a random `nonce` per attempt:

    v00000007.m                     the manifest: MAGIC, then a JSON length and the JSON
    v00000007.<nonce>.0000          one data file per `send` call, each tensor at a 64-byte aligned
    v00000007.<nonce>.0001          offset, its raw bytes in row-major order

The manifest (tensors, data files, nonce, digest) is written at `finish`, its MAGIC last: a reader sees
a whole version or none (HandleGone). A receiver checks nonce and digest against the version's row
before it yields a tensor (`WeightsUnverified` otherwise). Files are 0600, made O_EXCL | O_NOFOLLOW;
anything else in the namespace is foreign: `scan` reports it, nothing reads it. A finished version
rings the co-located servers' bells (bell.py). Files outlive the learner that sent them until the
version's durable checkpoint exists or a newer one is loaded (`release`, `loaded`, `keep_versions`,
`sweep`). A receiver's tensors are views of the mapped files, valid inside `open`'s block, with their
`FileLayout` for an engine in another process that maps the same files itself. Format and lifetime in
full: docs/transport.md, "shared_memory".
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from liveloop.transport import bell, private_dir
from liveloop.transport.base import (
    HandleGone, Receiver, Sender, TensorDigest, TransportFailed, WeightHandle, WeightsUnverified, new_nonce,
    require_authenticated, verify,
)
from liveloop.transport.config import TransportConfig
from liveloop.transport.private_dir import Foreign, ForeignFile
from liveloop.transport.weights import FileLayout, MappedFile, NamedTensors, TensorPlace, WeightSource

log = logging.getLogger(__name__)

MAGIC = b"LLWTMAN2"
_HEADER = struct.Struct("<8sQ")  # MAGIC, JSON length
_ALIGN = 64
_FILE = re.compile(r"v(\d{8})\.(m|([0-9a-f]{32})\.\d{4})")

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


def directory(namespace: str) -> Path:
    """The namespace's private directory (made 0700 or checked: see `private_dir`)."""
    return private_dir.namespace_dir(namespace)


def manifest_name(namespace: str, version: int) -> str:
    """The path of `version`'s manifest (also the ipc mailbox's: one naming scheme)."""
    return str(directory(namespace) / f"v{version:08d}.m")


def _data_name(version: int, nonce: str, index: int) -> str:
    return f"v{version:08d}.{nonce}.{index:04d}"


@dataclass(frozen=True)
class Scan:
    """A namespace's files: ours by version (file names), and what is foreign there."""

    versions: dict[int, list[str]]
    foreign: list[Foreign]


def scan(namespace: str) -> Scan:
    """What the namespace directory holds. A file is ours when its name is one this module makes and
    lstat says it is a regular file of our uid, mode 0600 at most; anything else is foreign (a planted
    file, a symlink, another owner): reported here, never read."""
    path = directory(namespace)
    found: dict[int, list[str]] = {}
    foreign: list[Foreign] = []
    try:
        names = os.listdir(path)
    except OSError:
        return Scan(found, foreign)
    uid = os.getuid()
    for name in names:
        try:
            st = os.lstat(path / name)
        except FileNotFoundError:
            continue
        if bell.NAME.fullmatch(name) and stat.S_ISSOCK(st.st_mode) and st.st_uid == uid:
            continue  # a server's bell (liveloop/transport/bell.py): neither a version nor foreign
        m = _FILE.fullmatch(name)
        if m is None:
            foreign.append(Foreign(str(path / name), "not a name this deployment makes"))
        elif not stat.S_ISREG(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
            foreign.append(Foreign(str(path / name), f"not our own 0600 file (uid {st.st_uid}, mode {st.st_mode:o})"))
        else:
            found.setdefault(int(m.group(1)), []).append(name)
    return Scan(found, foreign)


def segments(namespace: str) -> dict[int, list[str]]:
    """This namespace's files of ours, by version (empty where the directory cannot be listed)."""
    return scan(namespace).versions


def committed(namespace: str, version: int) -> bool:
    """Whether `version` has a finished manifest."""
    try:
        read_doc(manifest_name(namespace, version))
    except (HandleGone, WeightsUnverified):
        return False
    return True


def remove_version(namespace: str, version: int) -> int:
    """Remove every file of `version` (the manifest first: readers stop finding it); how many went."""
    path = directory(namespace)
    names = sorted(segments(namespace).get(version, []), key=lambda n: not n.endswith(".m"))
    gone = private_dir.remove(path / f"v{version:08d}.m")  # whatever sits under the manifest's name
    return gone + sum(private_dir.remove(path / n) for n in names if not n.endswith(".m"))


def unlink(name: str) -> bool:
    """Remove the file at path `name`; whether it existed."""
    return private_dir.remove(Path(name))


def write_doc(name: str, doc: dict) -> None:
    """A small JSON document in its own new file at path `name`, its MAGIC written last (readers see
    all or nothing)."""
    body = json.dumps(doc).encode()
    buf = private_dir.create(Path(name), _HEADER.size + len(body))
    try:
        buf[_HEADER.size:_HEADER.size + len(body)] = body
        struct.pack_into("<Q", buf, 8, len(body))
        buf[:8] = MAGIC
        buf.flush()
    finally:
        private_dir.close(buf)


def read_doc(name: str) -> dict:
    """The document `write_doc` finished at path `name`; HandleGone if it is missing or unfinished,
    WeightsUnverified if what is there is not our own file."""
    try:
        buf = private_dir.open_mapped(Path(name))
    except FileNotFoundError:
        raise HandleGone(f"shared_memory: {name} is gone") from None
    except ForeignFile as exc:
        raise WeightsUnverified(f"shared_memory: {exc}") from None
    try:
        if len(buf) < _HEADER.size:
            raise HandleGone(f"shared_memory: {name} is not a manifest")
        magic, length = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC or _HEADER.size + length > len(buf):
            raise HandleGone(f"shared_memory: {name} was never finished")
        try:
            return json.loads(bytes(buf[_HEADER.size:_HEADER.size + length]))
        except ValueError:
            raise WeightsUnverified(f"shared_memory: {name} is not a manifest this deployment wrote") from None
    finally:
        private_dir.close(buf)


def sweep(namespace: str, servable: Callable[[int], bool]) -> tuple[list[int], list[Foreign]]:
    """At a server's start: remove every version of the namespace that is unfinished or that
    `servable(version)` says nothing may serve any more (what a killed learner or server left), and
    report the foreign files. Returns (versions removed, foreign files)."""
    found = scan(namespace)
    removed = []
    for version in sorted(found.versions):
        if not committed(namespace, version) or not servable(version):
            remove_version(namespace, version)
            removed.append(version)
    for f in found.foreign:
        log.warning("shared memory: foreign file %s in this deployment's namespace (%s): ignored", f.path, f.why)
    return removed, found.foreign


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# -- sender ------------------------------------------------------------------------------------------
@dataclass
class _Update:
    nonce: str
    digest: TensorDigest
    segments: list[dict]  # {"name", "size"}
    tensors: list[dict]  # {"name", "dtype", "shape", "segment", "offset", "nbytes"}
    created: list[Path]  # every file created so far (for abort)


class SharedMemorySender(Sender):
    backend = "shared_memory"

    def __init__(self, namespace: str, keep_versions: int = 2, ring: bool = True):
        super().__init__()
        self.namespace = namespace
        self.keep_versions = keep_versions
        self.ring = ring  # ring the co-located servers' bells at each finished version
        self._update: _Update | None = None

    def _init(self) -> None:
        # a sender that crashed mid-update left unfinished versions: nobody can ever read them
        found = scan(self.namespace)
        for version in found.versions:
            if not committed(self.namespace, version):
                remove_version(self.namespace, version)
        for f in found.foreign:
            log.warning("shared memory: foreign file %s in this deployment's namespace (%s): ignored", f.path, f.why)

    def _start(self, version: int) -> None:
        # a failed earlier attempt at this number had no row, so nothing serves from it
        remove_version(self.namespace, version)
        self._update = _Update(new_nonce(), TensorDigest(), [], [], [])

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
        folder = directory(self.namespace)
        free = _free_bytes(folder)
        if free is not None and size > free:
            raise TransportFailed(f"shared_memory: {folder} has {free} bytes free, this send needs {size}")
        seg_name = _data_name(version, u.nonce, len(u.segments))
        buf = private_dir.create(folder / seg_name, size)
        u.created.append(folder / seg_name)
        try:
            view = memoryview(buf)
            copied: set[int] = set()
            hashed = []
            for name, t, offset in layout:
                nbytes = t.numel() * t.element_size()
                if nbytes and offset not in copied:
                    dst = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
                    dst.view(t.dtype).view(t.shape).copy_(t.detach())  # any layout or device: one pass
                    del dst
                    copied.add(offset)
                hashed.append((name, dtype_name(t.dtype), list(t.shape), view[offset:offset + nbytes]))
                u.tensors.append({
                    "name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                    "segment": len(u.segments), "offset": offset, "nbytes": nbytes,
                })
            u.digest.update_many(hashed)  # the bytes as written, the manifest's order
            del hashed
            view.release()
        finally:
            private_dir.close(buf)
        u.segments.append({"name": seg_name, "size": max(size, 1)})

    def _finish(self, version: int) -> WeightHandle:
        u = self._update
        assert u is not None
        name = manifest_name(self.namespace, version)
        u.created.append(Path(name))
        digest = u.digest.hexdigest()
        write_doc(name, {"version": version, "nonce": u.nonce, "digest": digest, "segments": u.segments, "tensors": u.tensors})
        self._update = None
        self._keep_newest()
        if self.ring:  # the servers' watchers look now rather than at their next poll
            bell.ring(directory(self.namespace), version)
        detail = {"segments": len(u.segments), "tensors": len(u.tensors)}
        return WeightHandle(self.backend, version, name, detail, nonce=u.nonce, digest=digest)

    def _abort(self, version: int) -> None:
        u, self._update = self._update, None
        if u is not None:
            for path in reversed(u.created):  # the manifest (if any) first
                private_dir.remove(path)

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

    def __init__(self, namespace: str, ring: bool = True):
        self.namespace = namespace
        self.ring = ring  # whether this deployment's senders ring (`[transport] bell`)

    def bell(self) -> bell.Bell | None:
        if not self.ring:
            return None
        try:
            return bell.Bell(directory(self.namespace))
        except OSError as exc:  # no socket here: the watcher polls
            log.warning("shared memory: no bell in %s (%s): the version watcher polls", self.namespace, exc)
            return None

    def handle_for(
        self, version: int, checkpoint_path: str | None = None, *, nonce: str | None = None, digest: str | None = None
    ) -> WeightHandle:
        return WeightHandle(self.backend, version, manifest_name(self.namespace, version), nonce=nonce, digest=digest)

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        require_authenticated(handle, "shared_memory")
        manifest = read_doc(handle.location)
        if manifest.get("version") != handle.version:
            raise HandleGone(f"shared_memory: {handle.location} holds version {manifest.get('version')}, not {handle.version}")
        verify(handle, manifest.get("nonce"), handle.digest, handle.location)
        folder = Path(handle.location).parent
        mapped: list[mmap.mmap] = []
        files: list[MappedFile] = []
        try:
            for s in manifest["segments"]:
                m = _FILE.fullmatch(str(s["name"]))
                if m is None or int(m.group(1)) != handle.version or m.group(3) != handle.nonce:
                    raise WeightsUnverified(f"shared_memory: the manifest of version {handle.version} names {s['name']!r}")
                try:
                    buf, st = private_dir.open_mapped_stat(folder / s["name"])
                except FileNotFoundError:
                    raise HandleGone(f"shared_memory: version {handle.version}'s segment {s['name']} is gone") from None
                except ForeignFile as exc:
                    raise WeightsUnverified(f"shared_memory: {exc}") from None
                mapped.append(buf)
                files.append(MappedFile(str(folder / s["name"]), len(buf), st.st_dev, st.st_ino))
                if len(buf) < s["size"]:
                    raise WeightsUnverified(f"shared_memory: segment {s['name']} is shorter than its manifest says")
            tensors = _verified(handle, manifest, mapped)
            # the bytes are the ones the row names, and a learner publishes finite weights only: the
            # engine need not scan them again (the digest replaces that pass); an engine in another
            # process maps these same files (the layout names them by inode) rather than copy them
            yield NamedTensors(tensors, verified=True, layout=_layout(manifest, files))
            del tensors
        finally:
            for buf in mapped:
                private_dir.close(buf)

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        with self.open(handle) as source:
            assert isinstance(source, NamedTensors)
            return {k: v.clone() for k, v in source.tensors.items()}

    def loaded(self, handle: WeightHandle, durable: bool) -> None:
        for version in segments(self.namespace):
            if version < handle.version or (version == handle.version and durable):
                remove_version(self.namespace, version)


def _layout(manifest: dict, files: list[MappedFile]) -> FileLayout:
    """Where the manifest's (verified) tensors lie in the mapped segment files."""
    return FileLayout(tuple(files), tuple(
        TensorPlace(t["name"], t["dtype"], tuple(t["shape"]), t["segment"], t["offset"], t["nbytes"]) for t in manifest["tensors"]
    ))


def _verified(handle: WeightHandle, manifest: dict, mapped: list[mmap.mmap]) -> dict[str, torch.Tensor]:
    """The manifest's tensors as views of the mapped files, after the digest of exactly those bytes
    matched the handle's (WeightsUnverified otherwise)."""
    digest = TensorDigest()
    views = [memoryview(buf) for buf in mapped]
    entries = []
    try:
        for t in manifest["tensors"]:
            if t["dtype"] not in _DTYPES or not 0 <= t["offset"] <= t["offset"] + t["nbytes"] <= len(mapped[t["segment"]]):
                raise WeightsUnverified(f"shared_memory: version {handle.version}'s manifest entry {t['name']!r} is out of bounds")
            entries.append((t["name"], t["dtype"], t["shape"], views[t["segment"]][t["offset"]:t["offset"] + t["nbytes"]]))
        digest.update_many(entries)
    except (KeyError, IndexError, TypeError) as exc:
        raise WeightsUnverified(f"shared_memory: version {handle.version}'s manifest is malformed ({exc!r})") from None
    finally:
        for e in entries:
            e[3].release()
        for v in views:
            v.release()
    verify(handle, handle.nonce, digest.hexdigest(), handle.location)
    return {t["name"]: _view(mapped[t["segment"]], t) for t in manifest["tensors"]}


def _view(buf: mmap.mmap, t: dict) -> torch.Tensor:
    dtype, shape = _DTYPES[t["dtype"]], tuple(t["shape"])
    if t["nbytes"] == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=torch.uint8, count=t["nbytes"], offset=t["offset"])
    return flat.view(dtype).view(shape)


def sender(config: TransportConfig, path_for: Callable[[int], Path] | None = None, base_model: str | Path | None = None,
           client: Any = None) -> SharedMemorySender:
    """The registry's constructor (`liveloop.transport.make_sender`)."""
    return SharedMemorySender(config.namespace, config.keep_versions, ring=config.bell)


def receiver(config: TransportConfig) -> SharedMemoryReceiver:
    return SharedMemoryReceiver(config.namespace, ring=config.bell)
