"""What a key's constrained requests store, side by side on fresh SQLite stores in one process: `--requests`
requests of `--n` choices each under one `--kb` KB grammar (the shape of issue 46's probe: n = 16 under a
60 KB schema), written through the store's own write path.

  once      the store as it is: the grammar once per key (`grammars`, store/grammars.py)
  per_row   the layout before migration 0017: the same rows with the grammar's text on each

Reported per arm: the database's bytes on disk (after the store's WAL checkpoint), the key's counted bytes for the
day (what `[server] stored_mb_per_day` is checked against), and the write's seconds; and the ratios.

    .venv/bin/python bench/grammar_storage.py --requests 20 --n 16 --kb 60
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from liveloop.store import ResponseRecord, Store, StoreConfig
from liveloop.store.keys import utc_day
from liveloop.store.models import Response, utcnow


def _records(request: int, n: int, grammar: str) -> list[ResponseRecord]:
    first = f"req{request}"
    return [
        ResponseRecord(
            id=first if i == 0 else f"{first}-{i}", api_key_id="k", model="m", policy_version=0, endpoint="chat",
            prompt_ids=tuple(range(5, 205)), response_ids=tuple(range(300, 364)), behavior_logprobs=(-1.0,) * 64,
            finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0, grammar=grammar, group_id=first, choice_index=i,
        )
        for i in range(n)
    ]


def run(arm: str, requests: int, n: int, grammar: str, root: Path) -> dict[str, float]:
    path = root / f"{arm}.db"
    store = Store(StoreConfig(url=f"sqlite:///{path}"))
    store.migrate()
    store.versions.ensure_base_version("/models/base")
    started = time.perf_counter()
    for r in range(requests):
        records = _records(r, n, grammar)
        store.feedback.write_batch(records)
        if arm == "per_row":  # the layout before 0017: the text on every row, counted with every row
            with store.db.writing.begin() as conn:
                ids = [rec.id for rec in records]
                conn.execute(Response.__table__.update().where(Response.id.in_(ids)).values(grammar=grammar, grammar_digest=None))
                conn.execute(text("DELETE FROM grammars"))
                conn.execute(text("UPDATE key_bytes SET bytes = bytes + :b"), {"b": len(grammar) * (n - 1)})
    seconds = time.perf_counter() - started
    counted = store.keys.stored_bytes("k", utc_day(utcnow()))
    store.rights.scrub()  # the WAL checkpointed into the database and truncated
    store.close()
    on_disk = sum(p.stat().st_size for p in root.glob(f"{arm}.db*"))
    return {"arm": arm, "bytes_on_disk": on_disk, "counted_bytes": counted, "write_seconds": round(seconds, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--kb", type=int, default=60)
    args = ap.parse_args()
    grammar = json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "x" * (args.kb * 1024)}})
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(arm, args.requests, args.n, grammar, Path(tmp)) for arm in ("per_row", "once")]
    base = rows[0]
    for row in rows:
        row["disk_vs_per_row"] = round(row["bytes_on_disk"] / base["bytes_on_disk"], 4)
        row["counted_vs_per_row"] = round(row["counted_bytes"] / base["counted_bytes"], 4)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
