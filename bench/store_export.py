"""`liveloop store export` throughput and memory: rows/s and peak RSS of an export of a 100k-rating
SQLite store against the same export of a 10k-rating one, side by side (constant memory = the peak RSS
does not grow with the store).

Each store is built once through the store's own tables (`store.bulk.insert_rows` into `responses` and
`feedback`, in transactions of 5,000): N chat responses to 64 different templated prompts (the tiny
model's chat template, ~20 prompt tokens), 64 response tokens each, every one rated (half up). Each
export (kto and raw, Parquet and JSONL) runs in a fresh child process, so its peak RSS (VmHWM) is that export's
own high-water mark; the child also reports its RSS after imports and the tokenizer load, before the
export reads a row, so the table shows what the export itself adds.

    .venv/bin/python bench/store_export.py                  # 10k and 100k ratings
    .venv/bin/python bench/store_export.py --sizes 1000,10000 --out bench/results/store_export_quick.json

Writes bench/results/store_export.json. Needs no torch: the export decodes with `tokenizers`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

CHUNK = 5000


def _status_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process. Not `getrusage`'s ru_maxrss: Linux keeps that across
    fork and exec, so a child would report its parent's peak; VmHWM belongs to the new address space."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build(url: str, n: int, model_dir: Path) -> float:
    import numpy as np
    from tokenizers import Tokenizer

    from liveloop.store import Store, StoreConfig
    from liveloop.store.bulk import insert_rows
    from liveloop.store.codec import encode_floats, encode_ids
    from liveloop.store.models import Feedback, Response, utcnow

    started = time.perf_counter()
    store = Store(StoreConfig(url=url, sqlite_synchronous="OFF"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [encode_ids(tok.encode(f"<|user|>\nTell me about topic number {k}, please.<|end|>\n<|assistant|>\n",
                                     add_special_tokens=False).ids) for k in range(64)]
    rng = np.random.default_rng(0)
    now = utcnow()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        responses, ratings = [], []
        for i in range(lo, hi):
            reply = rng.integers(10, 1000, 64).astype(np.int32)
            reply[-1] = 4
            rid = f"chatcmpl-{i:09d}"
            responses.append({
                "id": rid, "api_key_id": f"key{i % 50:04d}", "model": "liveloop-tiny", "policy_version": 0, "endpoint": "chat",
                "prompt_ids": prompts[i % 64], "response_ids": encode_ids(reply),
                "behavior_logprobs": encode_floats(rng.normal(-2, 1, 64).astype(np.float32)), "action_mask": None,
                "finish_reason": "stop", "temperature": 1.0, "top_p": 1.0, "seed": None, "prompt_tokens": 20,
                "completion_tokens": 64, "latency_ms": 10.0, "ttft_ms": 1.0, "request_meta": None, "created_at": now,
                "segment": None, "version_spans": None,
            })
            ratings.append({"response_id": rid, "api_key_id": f"key{i % 50:04d}", "reward": i % 2, "comment": None,
                            "created_at": now, "revisions": 0, "updated_at": None})
        with store.engine.begin() as conn:
            insert_rows(conn, Response.__table__, responses)
            insert_rows(conn, Feedback.__table__, ratings)
    store.close()
    return time.perf_counter() - started


def child(args: argparse.Namespace) -> None:
    """One export in this process; prints its figures as JSON."""
    from liveloop.store import Store, StoreConfig
    from liveloop.store.export import export
    from liveloop.store.export_text import TokenText

    text = None if args.shape == "raw" else TokenText(args.model)
    store = Store(StoreConfig(url=args.url))
    import pyarrow  # noqa: F401 - loaded before the baseline, as the export loads it

    before = _status_mib("VmRSS")
    result = export(store, args.out, args.format, args.shape, text=text)
    store.close()
    print(json.dumps({"rows": result.rows, "seconds": result.seconds, "rss_before_mib": round(before, 1),
                      "peak_rss_mib": round(_status_mib("VmHWM"), 1), "bytes": os.path.getsize(args.out)}))


def run_export(url: str, model_dir: Path, fmt: str, shape: str, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", "--url", url, "--format", fmt, "--shape", shape, "--out", str(out), "--model", str(model_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="store sizes in ratings, smallest first")
    parser.add_argument("--out", default=str(ROOT / "bench/results/store_export.json"), help="result file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--format", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    model_dir = ROOT / "models" / "liveloop-tiny"
    if not (model_dir / "tokenizer.json").is_file():  # build it (this imports torch, so only when missing)
        from common import default_model

        model_dir = default_model()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="store-export-") as tmp:
        for n in sizes:
            url = f"sqlite:///{Path(tmp) / f'store-{n}.db'}"
            built = build(url, n, model_dir)
            print(f"built a {n}-rating store in {built:.1f} s", file=sys.stderr)
            for shape in ("kto", "raw"):
                for fmt in ("parquet", "jsonl"):
                    got = run_export(url, model_dir, fmt, shape, Path(tmp) / f"out-{n}.{shape}.{fmt}")
                    assert got["rows"] == n, got
                    row = {"ratings": n, "shape": shape, "format": fmt, **got, "rows_per_s": round(got["rows"] / got["seconds"])}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    small, large = sizes[0], sizes[-1]
    print(f"| shape | format | rows/s at {small:,} | rows/s at {large:,} | peak RSS MiB at {small:,} | at {large:,} | RSS ratio | file MiB at {large:,} |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = {}
    for shape in ("kto", "raw"):
        for fmt in ("parquet", "jsonl"):
            a = next(r for r in rows if (r["ratings"], r["shape"], r["format"]) == (small, shape, fmt))
            b = next(r for r in rows if (r["ratings"], r["shape"], r["format"]) == (large, shape, fmt))
            ratio = b["peak_rss_mib"] / a["peak_rss_mib"]
            ratios[f"{shape}/{fmt}"] = round(ratio, 3)
            print(f"| {shape} | {fmt} | {a['rows_per_s']:,} | {b['rows_per_s']:,} | {a['peak_rss_mib']} | {b['peak_rss_mib']} | "
                  f"{ratio:.2f} | {b['bytes'] / 2**20:.1f} |")
    result = {"sizes": sizes, "rows": rows, "peak_rss_ratio": ratios, "cpu_count": os.cpu_count(),
              "load_avg": os.getloadavg(), "at": datetime.now(timezone.utc).isoformat()}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
