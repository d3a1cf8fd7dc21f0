"""Offline jobs on a store export: `liveloop offline kto`, the loop closed outside the online learner.

`train_kto` runs TRL's `KTOTrainer` (trl >= 1.16: `trl.KTOTrainer`, `trl.KTOConfig`) on a
`liveloop store export --shape kto` file (Parquet or JSONL, read with `datasets.load_dataset`), from
the served model's directory, either on all weights or on a LoRA adapter (peft) that is merged into
them (`merge_and_unload`) before saving, because `POST /admin/weights` takes full weights only. The
output directory is what that route accepts: `model.safetensors` (or its shards), the base model's own
`config.json`, generation config and tokenizer files (copied, so they equal the serving model's byte
for byte), and `liveloop_offline.json`, the lineage note: the export (path, sha256, rows, labels, the
policy versions it came from), the base model, the method and its settings. `OfflineResult.note` is
the one-line form of it to pass as the import's `note`, which the version row keeps (GET /v1/versions).

CPU by default here (one thread, float32: no bf16 on CPU), CUDA where present (`device="auto"`).
trl, peft, datasets and transformers are imported inside `train_kto` only, so the CLI's --help and
config loading stay light. The directory is written under a temporary name beside `out` and renamed
when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from liveloop.checkpoint import file_sha256

LINEAGE_FILE = "liveloop_offline.json"
# copied from the base model, never re-saved: the import requires them equal to the serving model's
BASE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")
KTO_COLUMNS = ("prompt", "completion", "label")


class OfflineError(ValueError):
    """An offline job that cannot run as asked (missing data, a wrong export shape, a bad setting)."""


@dataclass(frozen=True)
class OfflineKTO:
    data: str
    model: str
    out: str
    lora: bool = False
    steps: int = 100
    lr: float = 5e-6
    beta: float = 0.1
    batch_size: int = 4
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    lora_rank: int = 8

    def check(self) -> None:
        if not Path(self.data).is_file():
            raise OfflineError(f"--data: {self.data} is not a file (a `liveloop store export --shape kto` output)")
        if not (Path(self.model) / "config.json").is_file():
            raise OfflineError(f"--model: {self.model} is not a Hugging Face checkpoint directory (no config.json)")
        out = Path(self.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise OfflineError(f"--out: {out} exists and is not an empty directory")
        if not out.parent.is_dir():
            raise OfflineError(f"--out: the directory {out.parent} does not exist")
        if self.steps < 1 or self.batch_size < 1:
            raise OfflineError("--steps and --batch-size must be >= 1")
        if not (self.lr > 0 and self.beta > 0):
            raise OfflineError("--lr and --beta must be > 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise OfflineError(f"--device must be auto, cpu or cuda, not {self.device!r}")


@dataclass(frozen=True)
class OfflineResult:
    out: str  # absolute: what POST /admin/weights takes as `path`
    rows: int
    desirable: int
    undesirable: int
    steps: int
    loss: float | None
    device: str
    seconds: float
    note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _data_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    raise OfflineError(f"--data: {path} is neither .parquet nor .jsonl")


def load_kto(path: str | Path) -> Any:
    """The export as a `datasets.Dataset` with TRL's KTO columns (metadata columns dropped)."""
    import datasets

    path = Path(path)
    try:
        data = datasets.load_dataset(_data_format(path), data_files=str(path), split="train")
    except (ValueError, OSError) as exc:
        if isinstance(exc, OfflineError):
            raise
        raise OfflineError(f"--data: {path} does not load as a dataset: {exc}") from None
    missing = [c for c in KTO_COLUMNS if c not in data.column_names]
    if missing:
        raise OfflineError(f"--data: {path} lacks the KTO columns {missing} (export it with --shape kto)")
    if len(data) == 0:
        raise OfflineError(f"--data: {path} has no rows")
    return data


def train_kto(job: OfflineKTO) -> OfflineResult:
    job.check()
    started = time.perf_counter()
    data = load_kto(job.data)  # a wrong file fails here, before trl loads

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig, KTOTrainer

    meta = {c: data[c] for c in ("policy_version",) if c in data.column_names}
    kto = data.select_columns(list(KTO_COLUMNS))
    labels = kto["label"]
    desirable = int(sum(bool(x) for x in labels))
    device = "cuda" if job.device == "cuda" or (job.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise OfflineError("--device cuda: no CUDA device here")
    if device == "cpu":
        torch.set_num_threads(1)

    tokenizer = AutoTokenizer.from_pretrained(job.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(job.model, dtype=torch.float32)
    peft_config = None
    if job.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=job.lora_rank, lora_alpha=2 * job.lora_rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")

    out = Path(job.out)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        args = KTOConfig(
            output_dir=str(work / "trainer"), max_steps=job.steps, per_device_train_batch_size=min(job.batch_size, len(kto)),
            learning_rate=job.lr, beta=job.beta, seed=job.seed, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=device == "cpu", bf16=False, fp16=False, dataloader_num_workers=0, disable_tqdm=True,
            lr_scheduler_type="constant", warmup_steps=0,
        )
        trainer = KTOTrainer(model=model, args=args, train_dataset=kto, processing_class=tokenizer, peft_config=peft_config)
        trained = trainer.train()
        final = trainer.model
        if job.lora:
            final = final.merge_and_unload()
        final = final.to("cpu")
        ckpt = work / "checkpoint"
        final.save_pretrained(str(ckpt), safe_serialization=True)
        _check_tensor_names(Path(job.model), ckpt)
        for name in BASE_FILES:  # the base model's own, so the import finds them equal to the serving model's
            src = Path(job.model) / name
            (ckpt / name).unlink(missing_ok=True)
            if src.is_file():
                shutil.copyfile(src, ckpt / name)
        versions = sorted(set(meta.get("policy_version", [])))
        lineage = {
            "method": "kto", "lora": job.lora, "lora_rank": job.lora_rank if job.lora else None, "steps": job.steps,
            "learning_rate": job.lr, "beta": job.beta, "batch_size": args.per_device_train_batch_size, "seed": job.seed,
            "device": device, "base_model": str(Path(job.model).resolve()),
            "export": {"path": str(Path(job.data).resolve()), "sha256": file_sha256(Path(job.data)), "rows": len(kto),
                       "desirable": desirable, "undesirable": len(kto) - desirable,
                       "policy_versions": [versions[0], versions[-1]] if versions else None},
            "loss": trained.training_loss, "trl": _version("trl"), "finished_at": datetime.now(timezone.utc).isoformat(),
        }
        (ckpt / LINEAGE_FILE).write_text(json.dumps(lineage, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # checked empty above
        os.replace(ckpt, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    note = _note(lineage)
    return OfflineResult(str(out.resolve()), len(kto), desirable, len(kto) - desirable, job.steps, trained.training_loss, device,
                         time.perf_counter() - started, note)


def _note(lineage: dict[str, Any]) -> str:
    e = lineage["export"]
    span = e["policy_versions"]
    versions = f", versions {span[0]}-{span[1]}" if span else ""
    how = f"LoRA r{lineage['lora_rank']} merged" if lineage["lora"] else "full weights"
    note = (f"offline kto ({how}, {lineage['steps']} steps, lr {lineage['learning_rate']:g}, beta {lineage['beta']:g}) on "
            f"{e['rows']} ratings ({e['desirable']} up, {e['undesirable']} down{versions}) of {Path(e['path']).name} "
            f"sha256:{e['sha256'][:16]} from {lineage['base_model']}")
    return note[:1000]


def _check_tensor_names(base: Path, ckpt: Path) -> None:
    """The saved tensors are the base checkpoint's, by name and shape (what the import checks)."""
    def tensors(directory: Path) -> dict[str, tuple[int, ...]]:
        from safetensors import safe_open

        out: dict[str, tuple[int, ...]] = {}
        for f in sorted(directory.glob("*.safetensors")):
            with safe_open(str(f), "np") as st:
                for name in st.keys():
                    out[name] = tuple(st.get_slice(name).get_shape())
        return out

    want, got = tensors(base), tensors(ckpt)
    if want != got:
        extra, missing = sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5]
        raise OfflineError(f"the trained checkpoint's tensors differ from the base model's (extra {extra}, missing {missing})")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
