"""The `delta` backend: versions travel to replicas on other machines as the bytes that changed, through
a directory every machine reads (`delta_dir`: a shared filesystem, or an object store's mount).

    <delta_dir>/<namespace>/                    one per deployment (its random id, from the store)
        v00000007.json                          the manifest, written last (temporary name, fsync, rename)
        v00000007.<nonce>.safetensors           the version's data: a full copy, or a delta against its parent

Each version is written once, as a delta against the version sent before it (its `parent`), or as a
full copy every `delta_max_chain` versions and whenever a delta would not be smaller: no chain is
longer than that. A receiver reaches a version through the chain of deltas from the one it holds, or
from the nearest full copy (the route with fewer bytes first, the other if it fails). Per changed
tensor, a delta holds the smallest of its differing chunks, its byte-plane XOR (zlib), or the whole
tensor (`encode`); bytes are copied as they are, so any dtype is rebuilt bit for bit.

The receiver checks the rebuilt state's digest against the version's row before it yields anything;
when no route verifies it raises `DeltaUnusable` (a HandleGone: the publisher reads the durable
checkpoint). Formats, routes and costs: docs/transport.md, "delta".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from liveloop.checkpoint import fsync_dir
from liveloop.transport.base import (
    HandleGone, Receiver, Sender, TensorDigest, WeightHandle, byte_view, new_nonce, require_authenticated,
)
from liveloop.transport.config import TransportConfig
from liveloop.transport.shared_memory import _DTYPES, dtype_name
from liveloop.transport.weights import NamedTensors, WeightSource

log = logging.getLogger(__name__)

FORMAT = "liveloop-delta/1"
_MANIFEST = re.compile(r"v(\d{8})\.json")
_DATA = re.compile(r"v(\d{8})\.([0-9a-f]{32})\.safetensors")
_TEMP = re.compile(r"\.v\d{8}\..*\.tmp-\d+")


class DeltaUnusable(HandleGone):
    """No route through the delta directory rebuilds a version that verifies (files missing, changed or
    foreign): nothing of it serves, and the publisher reads the version's durable checkpoint instead."""


def directory(config: TransportConfig) -> Path:
    """The deployment's directory: `delta_dir` / its namespace (two deployments sharing one `delta_dir`
    never write over each other's versions)."""
    return Path(config.delta_dir) / config.namespace


def manifest_path(directory: str | Path, version: int) -> Path:
    return Path(directory) / f"v{version:08d}.json"


def _data_name(version: int, nonce: str) -> str:
    return f"v{version:08d}.{nonce}.safetensors"


@dataclass(frozen=True)
class Entry:
    """One name of the state: its dtype and shape, or the earlier entry whose memory it shares (tied)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    alias: int | None = None

    def doc(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "alias": self.alias}

    @classmethod
    def of(cls, doc: dict) -> "Entry":
        alias = doc.get("alias")
        return cls(str(doc["name"]), str(doc["dtype"]), tuple(int(d) for d in doc["shape"]), None if alias is None else int(alias))

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=_DTYPES[self.dtype]).element_size()

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * self.element_size


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass
class State:
    """A whole state as flat byte tensors (one per entry that is not an alias), with its layout."""

    version: int
    digest: str
    layout: tuple[Entry, ...]
    data: dict[int, torch.Tensor] = field(default_factory=dict)  # entry index -> uint8, flat

    def tensors(self) -> dict[str, torch.Tensor]:
        """Typed views by name (tied names share one tensor)."""
        out: dict[str, torch.Tensor] = {}
        for i, e in enumerate(self.layout):
            src = i if e.alias is None else e.alias
            if e.alias is not None:
                out[e.name] = out[self.layout[src].name]
            elif self.data[i].numel() == 0:
                out[e.name] = torch.empty(e.shape, dtype=_DTYPES[e.dtype])
            else:
                out[e.name] = self.data[i].view(_DTYPES[e.dtype]).view(e.shape)
        return out


def state_digest(layout: tuple[Entry, ...], data: Mapping[int, torch.Tensor]) -> str:
    """The `TensorDigest` of a state: each name in layout order (tied names with their source's bytes)."""
    digest = TensorDigest()
    digest.update_many([
        (e.name, e.dtype, list(e.shape), data[i if e.alias is None else e.alias].numpy()) for i, e in enumerate(layout)
    ])
    return digest.hexdigest()


def diff(old: torch.Tensor, new: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunks of `chunk` bytes where two flat uint8 tensors of one length differ: their indices
    (int64) and their new bytes, concatenated (the last chunk may be short)."""
    n = new.numel()
    full = n // chunk
    word = torch.int64 if n % 8 == 0 else torch.uint8
    a, b = old.view(word), new.view(word)
    per = chunk // (8 if word == torch.int64 else 1)
    changed = (a[: full * per] != b[: full * per]).view(full, per).any(dim=1).nonzero().flatten()
    parts = [new[: full * chunk].view(full, chunk)[changed].reshape(-1)]
    if n > full * chunk and not torch.equal(old[full * chunk:], new[full * chunk:]):
        changed = torch.cat([changed, torch.tensor([full])])
        parts.append(new[full * chunk:])
    return changed, torch.cat(parts)


def apply(base: torch.Tensor, idx: torch.Tensor, data: torch.Tensor, chunk: int) -> torch.Tensor:
    """`base` (flat uint8, not changed) with the chunks of `diff` written over it: a new tensor.
    ValueError when the chunks do not fit it."""
    n = base.numel()
    full = n // chunk
    tail = n - full * chunk
    if idx.dtype != torch.int64 or idx.dim() != 1 or data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError("malformed chunk entry")
    main = idx[idx < full]
    has_tail = bool((idx == full).any()) and tail > 0
    if idx.numel() != main.numel() + int(has_tail) or (main.numel() and int(main.min()) < 0):
        raise ValueError("chunk index out of range")
    if data.numel() != main.numel() * chunk + (tail if has_tail else 0):
        raise ValueError("chunk data has the wrong length")
    out = base.clone()
    if main.numel():
        out[: full * chunk].view(full, chunk)[main] = data[: main.numel() * chunk].view(-1, chunk)
    if has_tail:
        out[full * chunk:] = data[main.numel() * chunk:]
    return out


def xor_encode(old: torch.Tensor, new: torch.Tensor, element_size: int) -> torch.Tensor:
    """The XOR of two flat uint8 tensors of one length, as byte planes, zlib-compressed (uint8)."""
    planes = (old ^ new).view(-1, element_size).t().contiguous()
    return torch.frombuffer(bytearray(zlib.compress(planes.numpy().tobytes(), 1)), dtype=torch.uint8)


def xor_decode(base: torch.Tensor, packed: torch.Tensor, element_size: int) -> torch.Tensor:
    """`base` XOR what `xor_encode` packed: a new tensor. ValueError unless it unpacks to exactly base's
    length (never more: the output is bounded before it is produced)."""
    n = base.numel()
    if packed.dtype != torch.uint8 or packed.dim() != 1 or n % element_size:
        raise ValueError("malformed xor entry")
    z = zlib.decompressobj()
    raw = z.decompress(packed.numpy().tobytes(), n)
    if len(raw) != n or z.unconsumed_tail or not z.eof:
        raise ValueError("xor entry does not unpack to the tensor's length")
    planes = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(element_size, -1).t().reshape(-1)
    return base ^ planes


def encode(old: torch.Tensor, new: torch.Tensor, element_size: int, chunk: int) -> dict[str, torch.Tensor]:
    """The smallest encoding of a changed tensor (flat uint8): {"idx", "data"} (changed chunks),
    {"xor"} (compressed XOR planes) or {"full"}."""
    n = new.numel()
    idx, data = diff(old, new, chunk)
    chunks = data.numel() + idx.numel() * 8
    if chunks < n // 8:  # sparse: no need to try harder
        return {"idx": idx, "data": data}
    packed = xor_encode(old, new, element_size)
    best = min((chunks, "chunks"), (packed.numel(), "xor"), (n, "full"))[1]
    return {"idx": idx, "data": data} if best == "chunks" else {"xor": packed} if best == "xor" else {"full": new}


@dataclass(frozen=True)
class DeltaStats:
    """What a sender has written: bytes in its files against what full copies would have been."""

    versions: int = 0
    full_copies: int = 0
    bytes_sent: int = 0
    full_bytes: int = 0


# -- sender ------------------------------------------------------------------------------------------
class DeltaSender(Sender):
    backend = "delta"

    def __init__(self, directory: str | Path, max_chain: int = 8, chunk_bytes: int = 4096):
        super().__init__()
        self.directory = Path(directory)
        self.max_chain = max_chain
        self.chunk_bytes = chunk_bytes
        self.stats = DeltaStats()
        self._prev: State | None = None  # the last version finished: what the next delta is against
        self._chain = 0  # deltas since the last full copy
        self._layout: list[Entry] = []
        self._data: dict[int, torch.Tensor] = {}
        self._keys: dict[tuple, int] = {}
        self._digest = TensorDigest()
        self._nonce = ""
        self._created: list[Path] = []

    def _init(self) -> None:
        """Make the directory; remove what a sender that died mid-write left (temporary files, data with
        no manifest)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        names = os.listdir(self.directory)
        manifests = {int(m.group(1)) for n in names if (m := _MANIFEST.fullmatch(n))}
        for name in names:
            m = _DATA.fullmatch(name)
            if _TEMP.fullmatch(name) or (m and int(m.group(1)) not in manifests):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)
        self._prev = None  # whatever the directory holds, this sender's first version is a full copy

    def _start(self, version: int) -> None:
        self._layout, self._data, self._keys = [], {}, {}
        self._digest, self._nonce, self._created = TensorDigest(), new_nonce(), []

    def _send(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        hashed = []
        for name, t in tensors.items():
            key = _memory_key(t)
            dtype = dtype_name(t.dtype)
            if key is not None and key in self._keys:  # tied: the same memory under another name
                src = self._keys[key]
                self._layout.append(Entry(name, dtype, tuple(t.shape), alias=src))
                hashed.append((name, dtype, list(t.shape), self._data[src].numpy()))
                continue
            i = len(self._layout)
            flat = byte_view(t.detach().to("cpu", copy=True))
            self._layout.append(Entry(name, dtype, tuple(t.shape)))
            self._data[i] = flat
            if key is not None:
                self._keys[key] = i
            hashed.append((name, dtype, list(t.shape), flat.numpy()))
        self._digest.update_many(hashed)

    def _finish(self, version: int) -> WeightHandle:
        layout, digest, nonce = tuple(self._layout), self._digest.hexdigest(), self._nonce
        full_bytes = sum(t.numel() for t in self._data.values())
        prev = self._prev
        delta = prev is not None and prev.layout == layout and self._chain < self.max_chain
        payload, changed = ({}, []) if not delta else self._delta(prev, layout)
        if delta and sum(t.numel() * t.element_size() for t in payload.values()) >= full_bytes:
            delta = False  # a delta no smaller than the whole: a full copy starts a new chain
        if not delta:
            payload = {f"{i}.full": t for i, t in self._data.items()}
            changed = [e.name for e in layout]
        name = _data_name(version, nonce)
        self._write(name, lambda path: save_file(payload, str(path), metadata={"format": FORMAT}))
        size = (self.directory / name).stat().st_size
        doc = {
            "format": FORMAT, "version": version, "parent": prev.version if delta else None,
            "kind": "delta" if delta else "full", "nonce": nonce, "digest": digest, "chunk_bytes": self.chunk_bytes,
            "tensors": [e.doc() for e in layout], "changed": changed, "file": name,
            "file_sha256": _file_sha256(self.directory / name), "bytes": size, "full_bytes": full_bytes,
        }
        body = json.dumps(doc).encode()
        self._write(manifest_path(self.directory, version).name, lambda path: path.write_bytes(body))  # last: the version exists
        fsync_dir(self.directory)
        self._prev = State(version, digest, layout, self._data)
        self._chain = self._chain + 1 if delta else 0
        self._data, self._keys, self._created = {}, {}, []
        s = self.stats
        self.stats = DeltaStats(s.versions + 1, s.full_copies + (not delta), s.bytes_sent + size, s.full_bytes + full_bytes)
        if not delta:
            self._prune(version)
        detail = {"kind": doc["kind"], "parent": doc["parent"], "bytes": size, "full_bytes": full_bytes, "changed": len(changed)}
        return WeightHandle(self.backend, version, str(manifest_path(self.directory, version)), detail, nonce=nonce, digest=digest)

    def _delta(self, prev: State, layout: tuple[Entry, ...]) -> tuple[dict[str, torch.Tensor], list[str]]:
        changed = [i for i, new in self._data.items() if new.numel() and not torch.equal(prev.data[i], new)]

        def one(i: int) -> dict[str, torch.Tensor]:
            return encode(prev.data[i], self._data[i], layout[i].element_size, self.chunk_bytes)

        workers = min(8, os.cpu_count() or 1)
        if workers > 1 and sum(self._data[i].numel() for i in changed) >= TensorDigest.PARALLEL_BYTES:
            with ThreadPoolExecutor(workers) as pool:  # zlib and the comparisons let go of the GIL
                encoded = list(pool.map(one, changed))
        else:
            encoded = [one(i) for i in changed]
        payload = {f"{i}.{kind}": t for i, parts in zip(changed, encoded) for kind, t in parts.items()}
        return payload, [layout[i].name for i in changed]

    def _write(self, name: str, write: Callable[[Path], Any]) -> None:
        """A file under its final name whole or not at all: written under a temporary name, fsync'd, renamed."""
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        self._created.append(tmp)
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / name)
        self._created.append(self.directory / name)

    def _abort(self, version: int) -> None:
        created, self._created = self._created, []
        for path in reversed(created):  # the manifest (if any) first
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._data, self._keys = {}, {}

    def release(self, version: int) -> None:
        """`version` will never serve (its row was refused, or the learner stops): its files go, and a
        later version is not written against it (the next one is a full copy)."""
        remove_version(self.directory, version)
        if self._prev is not None and self._prev.version == version:
            self._prev = None

    def _prune(self, newest_full: int) -> None:
        """A full copy was written: versions before the previous full copy go (a receiver further behind
        starts from one of the two)."""
        fulls = sorted(v for v, doc in _manifests(self.directory).items() if doc.get("kind") == "full" and v <= newest_full)
        if len(fulls) < 2:
            return
        for version in versions(self.directory):
            if version < fulls[-2]:
                remove_version(self.directory, version)


def _memory_key(t: torch.Tensor) -> tuple | None:
    if t.numel() == 0:
        return None
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def versions(directory: str | Path) -> list[int]:
    """The versions with a file in `directory` (finished or not), oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted({int(m.group(1)) for n in names if (m := _MANIFEST.fullmatch(n) or _DATA.fullmatch(n))})


def remove_version(directory: str | Path, version: int) -> None:
    """Every file of `version`, its manifest first (receivers stop finding it)."""
    directory = Path(directory)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(manifest_path(directory, version))
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            m = _DATA.fullmatch(name)
            if m and int(m.group(1)) == version:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)


def read_manifest(directory: str | Path, version: int) -> dict:
    """`version`'s manifest; DeltaUnusable when it is missing or not one."""
    path = manifest_path(directory, version)
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise DeltaUnusable(f"delta: {path} is not there (never written, or pruned)") from None
    except (OSError, ValueError) as exc:
        raise DeltaUnusable(f"delta: {path} is not a manifest ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != version:
        raise DeltaUnusable(f"delta: {path} is not version {version}'s manifest")
    return doc


def _manifests(directory: Path) -> dict[int, dict]:
    out = {}
    for version in versions(directory):
        with contextlib.suppress(DeltaUnusable):
            out[version] = read_manifest(directory, version)
    return out


# -- receiver ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """How to rebuild a version: from the receiver's own state (`base` its version) or a full copy
    (`base` None), through these manifests, oldest first; `bytes` to read."""

    base: int | None
    steps: tuple[dict, ...]
    bytes: int


class DeltaReceiver(Receiver):
    backend = "delta"

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._state: State | None = None  # the last version rebuilt and verified: the next chain's start
        self._lock = threading.Lock()  # one rebuild at a time (the publisher's threads, a learner's recovery)
        self.last_route: Route | None = None
        self.bytes_read = 0

    @property
    def holds(self) -> int | None:
        """The version whose state this receiver keeps (a chain's start), or None."""
        return None if self._state is None else self._state.version

    def handle_for(
        self, version: int, checkpoint_path: str | None = None, *, nonce: str | None = None, digest: str | None = None
    ) -> WeightHandle:
        return WeightHandle(self.backend, version, str(manifest_path(self.directory, version)), nonce=nonce, digest=digest)

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        state = self.rebuild(handle)
        # its digest is the row's, and a learner publishes finite weights only: the engine need not scan them
        yield NamedTensors(state.tensors(), verified=True)

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.rebuild(handle).tensors().items()}

    def rebuild(self, handle: WeightHandle) -> State:
        """The full state of `handle`'s version, rebuilt along the cheaper route and verified against the
        handle's (its row's) nonce and digest; the other route if that fails; DeltaUnusable if neither
        verifies. The result becomes this receiver's state."""
        require_authenticated(handle, "delta")
        with self._lock:
            return self._rebuild(handle)

    def _rebuild(self, handle: WeightHandle) -> State:
        target = read_manifest(self.directory, handle.version)
        if not secrets.compare_digest(str(target.get("nonce") or ""), handle.nonce or ""):
            raise self._unusable(handle, f"the manifest's nonce {target.get('nonce')!r} is not the row's (another attempt's files)")
        if not secrets.compare_digest(str(target.get("digest") or ""), handle.digest or ""):
            raise self._unusable(handle, "the manifest's digest is not the row's")
        errors = []
        for route in self._routes(target):
            try:
                state = self._follow(route, target, handle)
            except Exception as exc:  # untrusted files: whatever fails to parse or verify drops the route
                errors.append(f"from {'full copy' if route.base is None else f'version {route.base}'}: {exc}")
                continue
            self._state, self.last_route = state, route
            self.bytes_read += route.bytes
            return state
        raise self._unusable(handle, "; ".join(errors) or "no full copy or held version leads to it")

    def _unusable(self, handle: WeightHandle, why: str) -> DeltaUnusable:
        log.error("delta: version %d cannot be rebuilt from %s (%s): its durable checkpoint is read instead", handle.version, self.directory, why)
        return DeltaUnusable(f"delta: version {handle.version}: {why}")

    def _routes(self, target: dict) -> list[Route]:
        """From the held state (when the chain back from `target` passes it) and from the nearest full
        copy, cheaper first."""
        chain, doc = [target], target
        held = self._state
        routes: list[Route] = []
        while True:
            if held is not None and doc["version"] == held.version and doc["digest"] == held.digest:
                steps = tuple(reversed(chain[:-1]))
                routes.append(Route(held.version, steps, sum(int(d["bytes"]) for d in steps)))
            if doc["kind"] == "full":
                steps = tuple(reversed(chain))
                routes.append(Route(None, steps, sum(int(d["bytes"]) for d in steps)))
                break
            parent = doc.get("parent")
            if not isinstance(parent, int) or not 0 <= parent < doc["version"]:
                break
            try:
                doc = read_manifest(self.directory, parent)
            except DeltaUnusable:
                break
            chain.append(doc)
        return sorted(routes, key=lambda r: r.bytes)

    def _follow(self, route: Route, target: dict, handle: WeightHandle) -> State:
        layout = tuple(Entry.of(e) for e in target["tensors"])
        data: dict[int, torch.Tensor] = {}
        if route.base is not None:
            assert self._state is not None
            if self._state.layout != layout:
                raise DeltaUnusable(f"version {route.base} has another layout")
            data = dict(self._state.data)  # shared until a step changes them: the held state is never written
        for doc in route.steps:
            if tuple(Entry.of(e) for e in doc["tensors"]) != layout:
                raise DeltaUnusable(f"version {doc['version']} has another layout")
            payload = self._payload(doc)
            chunk = int(doc["chunk_bytes"])
            for i, e in enumerate(layout):
                if e.alias is not None:
                    continue
                if f"{i}.full" in payload:
                    t = payload[f"{i}.full"]
                    if t.dtype != torch.uint8 or t.numel() != e.nbytes:
                        raise DeltaUnusable(f"version {doc['version']}: {e.name} has {t.numel()} bytes, not {e.nbytes}")
                    data[i] = t
                elif f"{i}.idx" in payload or f"{i}.xor" in payload:
                    if i not in data:
                        raise DeltaUnusable(f"version {doc['version']}: a delta of {e.name} with nothing under it")
                    if f"{i}.xor" in payload:
                        data[i] = xor_decode(data[i], payload[f"{i}.xor"], e.element_size)
                    else:
                        data[i] = apply(data[i], payload[f"{i}.idx"], payload[f"{i}.data"], chunk)
                elif i not in data:
                    raise DeltaUnusable(f"version {doc['version']}: {e.name} is in no file")
        digest = state_digest(layout, data)
        if not secrets.compare_digest(digest, handle.digest or ""):
            raise DeltaUnusable(f"the rebuilt state's digest {digest} is not the row's {handle.digest}")
        return State(handle.version, digest, layout, data)

    def _payload(self, doc: dict) -> dict[str, torch.Tensor]:
        """A step's data file, read whole and checked against its manifest's sha256 first."""
        name = str(doc["file"])
        m = _DATA.fullmatch(name)
        if m is None or int(m.group(1)) != doc["version"] or m.group(2) != doc["nonce"]:
            raise DeltaUnusable(f"version {doc['version']}'s manifest names {name!r}")
        try:
            raw = (self.directory / name).read_bytes()
        except FileNotFoundError:
            raise DeltaUnusable(f"{name} is gone") from None
        if hashlib.sha256(raw).hexdigest() != doc["file_sha256"]:
            raise DeltaUnusable(f"{name} is not the file its manifest names (sha256 differs)")
        return load_safetensors(raw)


def sender(config: TransportConfig, path_for: Callable[[int], Path] | None = None, base_model: str | Path | None = None,
           client: Any = None) -> DeltaSender:
    """The registry's constructor (`liveloop.transport.make_sender`)."""
    return DeltaSender(directory(config), config.delta_max_chain, config.delta_chunk_bytes)


def receiver(config: TransportConfig) -> DeltaReceiver:
    return DeltaReceiver(directory(config))
