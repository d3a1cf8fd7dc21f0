"""An operator's checkpoint is copied into managed storage and checked there before it can serve
(server/control/weights_import.py): regular files only (a symlink, a FIFO, a subdirectory refuse it; a FIFO is
never opened), at most max_import_bytes, the serving model's tensor names and shapes, its config and
vocabulary; what it lacks of them is taken from the serving model. Every refusal leaves nothing in
checkpoint_dir. Real files and the real tiny model; no store (tests/integration/server/
test_weights_import.py runs the whole path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from liveloop.checkpoint import checkpoint_digest
from liveloop.server.control.weights_import import ImportRefused, ImportTooLarge, WeightImports, safetensors_tensors

GIB = 1 << 30


def _importer(tmp_path: Path, model_dir: Path, max_bytes: int = 64 * GIB) -> WeightImports:
    return WeightImports(tmp_path / "versions", model_dir, max_bytes)


def _only_weights(model_dir: Path, where: Path) -> Path:
    where.mkdir()
    shutil.copy(Path(model_dir) / "model.safetensors", where / "model.safetensors")
    return where


def _full_copy(model_dir: Path, where: Path) -> Path:
    shutil.copytree(model_dir, where)
    return where


def _left_in(importer: WeightImports) -> list[str]:
    root = importer.checkpoint_dir
    return sorted(os.listdir(root)) if root.exists() else []


def _refused(importer: WeightImports, path: Path, code: str) -> ImportRefused:
    with pytest.raises(ImportRefused) as caught:
        importer.stage(str(path))
    assert caught.value.code == code, str(caught.value)
    assert _left_in(importer) == []  # nothing half-written stays behind
    return caught.value


def test_a_directory_with_only_model_safetensors_is_completed_from_the_serving_model(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    source = _only_weights(model_dir, tmp_path / "op")
    (source / "README.md").write_text("notes")
    (source / "optimizer.pt").write_bytes(b"\0" * 64)
    staged = importer.stage(str(source))

    assert staged.staging.parent == importer.checkpoint_dir and staged.staging.name.startswith(f".staging-{os.getpid()}-import-")
    served = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert set(staged.completed) == served and staged.left_behind == ("README.md", "optimizer.pt")
    assert sorted(os.listdir(staged.policy)) == sorted(served | {"model.safetensors"})
    for name in served:  # byte for byte the serving model's
        assert (staged.policy / name).read_bytes() == (Path(model_dir) / name).read_bytes()
    # the digest is checkpoint_digest's, of the copy (here: the serving model's bytes)
    assert staged.digest == checkpoint_digest(staged.policy) == checkpoint_digest(model_dir)
    assert staged.size == (source / "model.safetensors").stat().st_size

    # a complete, startable checkpoint: transformers loads the model and the tokenizer from the copy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(staged.policy))
    base = load_file(str(Path(model_dir) / "model.safetensors"))
    assert torch.equal(model.state_dict()["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert AutoTokenizer.from_pretrained(str(staged.policy)).encode("hello") == AutoTokenizer.from_pretrained(str(model_dir)).encode("hello")


def test_a_complete_checkpoint_is_copied_as_it_is(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    source = _full_copy(model_dir, tmp_path / "op")
    config = json.loads((source / "config.json").read_text())
    config["transformers_version"] = "0.0.1"  # how it was saved, not what it computes
    (source / "config.json").write_text(json.dumps(config))
    staged = importer.stage(str(source))
    assert staged.completed == () and staged.left_behind == ("liveloop_build.json",)
    assert json.loads((staged.policy / "config.json").read_text())["transformers_version"] == "0.0.1"


def test_a_symlink_inside_the_directory_is_refused(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    source = _only_weights(model_dir, tmp_path / "op")
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (source / "config.json").symlink_to(secret)
    error = _refused(importer, source, "not_a_regular_file")
    assert str(error).startswith(f"path: {source}/config.json is a symlink;")

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(Path(model_dir) / "model.safetensors")
    _refused(importer, linked, "not_a_regular_file")


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_being_opened(tmp_path, model_dir):
    """Opening a FIFO for reading blocks until a writer comes: an import that opened one would hang."""
    importer = _importer(tmp_path, model_dir)
    source = _only_weights(model_dir, tmp_path / "op")
    os.mkfifo(source / "tokenizer.json")
    error = _refused(importer, source, "not_a_regular_file")
    assert "tokenizer.json is a FIFO" in str(error)

    weights_fifo = tmp_path / "fifo-weights"
    weights_fifo.mkdir()
    os.mkfifo(weights_fifo / "model.safetensors")
    _refused(importer, weights_fifo, "not_a_regular_file")


def test_a_subdirectory_is_refused(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    source = _only_weights(model_dir, tmp_path / "op")
    (source / "checkpoint-100").mkdir()
    assert "checkpoint-100 is a directory" in str(_refused(importer, source, "not_a_regular_file"))


def test_more_than_max_bytes_is_refused_before_anything_is_copied(tmp_path, model_dir):
    size = (Path(model_dir) / "model.safetensors").stat().st_size
    source = _only_weights(model_dir, tmp_path / "op")
    assert _importer(tmp_path, model_dir, max_bytes=size).stage(str(source)).size == size  # the bound itself is allowed
    shutil.rmtree(tmp_path / "versions")

    importer = _importer(tmp_path, model_dir, max_bytes=size - 1)
    with pytest.raises(ImportTooLarge) as caught:
        importer.stage(str(source))
    assert caught.value.code == "checkpoint_too_large" and f"server.max_import_bytes is {size - 1}" in str(caught.value)
    assert _left_in(importer) == []

    # a sparse terabyte is refused on its size, not read
    huge = _only_weights(model_dir, tmp_path / "huge")
    with (huge / "tokenizer.json").open("wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(ImportTooLarge):
        _importer(tmp_path, model_dir).stage(str(huge))


def _weights_with(model_dir: Path, where: Path, change) -> Path:
    where.mkdir()
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(where / "model.safetensors"), metadata={"format": "pt"})
    return where


def test_tensors_that_are_not_the_serving_models_are_refused(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    name = "model.layers.0.self_attn.q_proj.weight"

    def transpose(t):
        t[name] = t[name].t().contiguous()

    def drop(t):
        del t[name]

    def add(t):
        t["lm_head.extra"] = torch.zeros(2)

    error = _refused(importer, _weights_with(model_dir, tmp_path / "shape", transpose), "tensor_mismatch")
    shape = list(load_file(str(Path(model_dir) / "model.safetensors"))[name].shape)
    assert f"{name} is {shape[::-1]} (the serving model's: {shape})" in str(error)
    assert f"missing ['{name}']" in str(_refused(importer, _weights_with(model_dir, tmp_path / "drop", drop), "tensor_mismatch"))
    assert "unexpected ['lm_head.extra']" in str(_refused(importer, _weights_with(model_dir, tmp_path / "add", add), "tensor_mismatch"))


def test_a_file_that_is_not_safetensors_is_refused(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "is not a safetensors file" in str(_refused(importer, junk, "unloadable_weights"))

    truncated = _only_weights(model_dir, tmp_path / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:-100])
    _refused(importer, truncated, "unloadable_weights")

    renamed = tmp_path / "renamed"  # transformers would not find it: one file must be model.safetensors
    renamed.mkdir()
    shutil.copy(Path(model_dir) / "model.safetensors", renamed / "weights.safetensors")
    _refused(importer, renamed, "unloadable_weights")


def test_a_config_of_another_shape_or_another_vocabulary_is_refused(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    other = _full_copy(model_dir, tmp_path / "config")
    config = json.loads((other / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (other / "config.json").write_text(json.dumps(config))
    assert "differs from the serving model's in num_hidden_layers" in str(_refused(importer, other, "config_mismatch"))

    vocab = _full_copy(model_dir, tmp_path / "vocab")
    tokenizer = json.loads((vocab / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = tokenizer.get("added_tokens", [])[:-1]
    (vocab / "tokenizer.json").write_text(json.dumps(tokenizer))
    _refused(importer, vocab, "tokenizer_mismatch")


def test_missing_paths_are_not_checkpoints(tmp_path, model_dir):
    importer = _importer(tmp_path, model_dir)
    for path in (tmp_path / "nope", tmp_path / ("a" * 300)):
        error = _refused(importer, path, "not_a_checkpoint")
        assert str(error) == f"path: {path} is not a checkpoint directory with *.safetensors"
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(importer, empty, "not_a_checkpoint")


def test_stale_import_staging_is_swept_when_the_importer_starts(tmp_path, model_dir):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = tmp_path / "versions" / f".staging-{proc.pid}-import-abc"
    stale.mkdir(parents=True)
    (stale / "half.safetensors").write_bytes(b"x")
    _importer(tmp_path, model_dir)
    assert not stale.exists()


def test_the_header_check_reads_what_safetensors_writes(tmp_path):
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}, str(tmp_path / "x.safetensors"))
    assert safetensors_tensors(tmp_path / "x.safetensors") == {"a": ("F32", (2, 3)), "b": ("BF16", (4,))}


@pytest.mark.timeout(30)
def test_a_file_swapped_for_a_fifo_after_it_was_looked_at_is_not_read(tmp_path, model_dir):
    """The race between the lstat and the open: the file is opened without blocking and must still be
    the one that was lstat'ed, so a FIFO put in its place is seen as one and never read."""
    importer = _importer(tmp_path, model_dir)
    source = _full_copy(model_dir, tmp_path / "op")
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        looked_at = os.stat("tokenizer.json", dir_fd=fd, follow_symlinks=False)
        os.unlink(source / "tokenizer.json")
        os.mkfifo(source / "tokenizer.json")
        (tmp_path / "out").mkdir()
        with pytest.raises(ImportRefused) as caught:
            importer._copy(str(source), fd, "tokenizer.json", looked_at, tmp_path / "out" / "tokenizer.json")
    finally:
        os.close(fd)
    assert caught.value.code == "changed" and not (tmp_path / "out" / "tokenizer.json").exists()
