"""The versioned feedback as a dataset offline trainers read directly (`liveloop store export`).

One row per trainable rating: a rating (`feedback`) joined to the response it rates. Never exported,
whatever the filters say: ratings given by, or on responses served to, a quarantined or forgotten key,
and responses with a deletion tombstone (deleted and forgotten data is otherwise gone from the tables:
store/rights.py; a `store: false` request is never logged).

Shapes (`SHAPES`): `kto` (TRL's unpaired preferences), `preference` (chosen/rejected pairs of one
prompt), `sft` (up-rated replies as messages), `episode` (an agent's whole trajectory up to the rated
turn, with the tokens as the learner lays them out) and `raw` (everything the learner reads). The
trainer shapes decode token ids with the served model's tokenizer (`export_text.TokenText`), in TRL's
conversational (`prompt_form="messages"`) or standard (`"text"`) format; tool use keeps TRL's
tool-calling shape. No typed marker becomes a turn: text is escaped, and a row whose prompt tokens hold
a forged turn is left out where its tokens would be given (`skipped["forged_turn"]`).

Streamed in constant memory (keyset pages by feedback id; `preference` one query ordered by prompt);
written under a private temporary name in the output's directory and renamed when complete, so a failed
export leaves no file. The full rules (pairing, tool columns, markers, privacy of the file):
docs/export.md.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
from sqlalchemy import and_, exists, func, not_, or_, select
from sqlalchemy.orm import aliased

from liveloop.episodes import EpisodeMismatch, episode_layout
from liveloop.private import private_temp
from liveloop.sampling import PLAIN, Sampling
from liveloop.store.codec import decode_floats, decode_ids
from liveloop.store.models import ApiKey, DeletedResponse, Feedback, Response
from liveloop.store.records import stored_sampling
from liveloop.store.store import Store

Shape = Literal["kto", "preference", "sft", "raw", "episode"]
Format = Literal["parquet", "jsonl"]
PromptForm = Literal["messages", "text"]
SHAPES: tuple[str, ...] = ("kto", "preference", "sft", "raw", "episode")
FORMATS: tuple[str, ...] = ("parquet", "jsonl")
PROMPT_FORMS: tuple[str, ...] = ("messages", "text")
PAGE = 1000  # ratings read per keyset page
CHAT_ENDPOINTS: tuple[str, ...] = ("chat", "messages", "responses")  # prompts rendered by the chat template


class ExportError(ValueError):
    """An export that cannot run as asked (a bad filter, an output path that cannot be written)."""


@dataclass(frozen=True)
class ExportFilter:
    """Which ratings to export; None: no bound. Times bound when the rating was last given (rated_at),
    inclusive since, exclusive until. `keys`: the raters' key ids (digests). `segments`: the adapter
    segments that served the responses."""

    since: datetime | None = None
    until: datetime | None = None
    versions: frozenset[int] | None = None
    segments: frozenset[str] | None = None
    keys: frozenset[str] | None = None


@dataclass(frozen=True)
class RatedRow:
    """One trainable rating with the response it rates, as the export reads them."""

    feedback_id: int
    response_id: str
    key_id: str
    reward: int
    rated_at: datetime
    created_at: datetime
    policy_version: int
    version_spans: tuple[tuple[int, int, int], ...] | None
    segment: str | None
    endpoint: str
    finish_reason: str
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    behavior_logprobs: np.ndarray
    messages: list[dict[str, Any]] | None = None  # a chat-shaped response's conversation (its own turn's input)
    tools: list[dict[str, Any]] | None = None
    output: dict[str, Any] | None = None
    previous_response_id: str | None = None
    options: dict[str, Any] | None = None
    owner: str = ""  # the key that got the response (whose chain `previous_response_id` names)
    parent_id: str | None = None  # the turn it continues (store/episodes.py)
    sampling: Sampling = PLAIN  # how it was drawn: what its behaviour logprobs are the distribution of


@dataclass(frozen=True)
class ExportResult:
    path: str
    format: str
    shape: str
    rows: int
    ratings_read: int
    skipped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "shape": self.shape, "rows": self.rows,
                "ratings_read": self.ratings_read, "skipped": dict(self.skipped), "seconds": round(self.seconds, 3)}


# -- reading ------------------------------------------------------------------------------------------
def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _select(filt: ExportFilter) -> Any:
    rater, owner = aliased(ApiKey), aliased(ApiKey)
    rated_at = func.coalesce(Feedback.updated_at, Feedback.created_at)
    allowed = lambda key: or_(key.key_id.is_(None), and_(key.quarantined.is_(False), key.forgotten_at.is_(None)))  # noqa: E731
    q = (
        select(
            Feedback.id, Feedback.response_id, Feedback.api_key_id, Feedback.reward, Feedback.created_at, Feedback.updated_at,
            Response.created_at, Response.policy_version, Response.version_spans, Response.segment, Response.endpoint,
            Response.finish_reason, Response.prompt_ids, Response.response_ids, Response.behavior_logprobs,
            Response.messages, Response.tools, Response.output, Response.previous_response_id, Response.options, Response.api_key_id,
            Response.parent_id, Response.sampling, Response.temperature, Response.top_p,
        )
        .join(Response, Response.id == Feedback.response_id)
        .outerjoin(rater, rater.key_id == Feedback.api_key_id)
        .outerjoin(owner, owner.key_id == Response.api_key_id)
        .where(allowed(rater), allowed(owner))
        .where(not_(exists().where(DeletedResponse.response_id == Response.id)))
    )
    if filt.since is not None:
        q = q.where(rated_at >= _utc(filt.since))
    if filt.until is not None:
        q = q.where(rated_at < _utc(filt.until))
    if filt.versions is not None:
        q = q.where(Response.policy_version.in_(sorted(filt.versions)))
    if filt.segments is not None:
        q = q.where(Response.segment.in_(sorted(filt.segments)))
    if filt.keys is not None:
        q = q.where(Feedback.api_key_id.in_(sorted(filt.keys)))
    return q


def _row(r: Any) -> RatedRow:
    spans = tuple((int(a), int(b), int(v)) for a, b, v in r[8]) if r[8] else None
    return RatedRow(
        feedback_id=r[0], response_id=r[1], key_id=r[2], reward=int(r[3]), rated_at=_utc(r[5] or r[4]), created_at=_utc(r[6]),
        policy_version=r[7], version_spans=spans, segment=r[9], endpoint=r[10], finish_reason=r[11],
        prompt_ids=decode_ids(r[12]), response_ids=decode_ids(r[13]), behavior_logprobs=decode_floats(r[14]),
        messages=r[15], tools=r[16], output=r[17], previous_response_id=r[18], options=r[19], owner=r[20], parent_id=r[21],
        sampling=stored_sampling(r[22], r[23], r[24]),
    )


def has_tools(store: Store, filt: ExportFilter = ExportFilter()) -> bool:
    """Whether any exportable rating rates a response that was offered tools (a call needs them)."""
    with store.db.session() as s:
        return s.execute(_select(filt).where(Response.tools.is_not(None)).limit(1)).first() is not None


def rated_rows(store: Store, filt: ExportFilter = ExportFilter(), page: int = PAGE) -> Iterator[RatedRow]:
    """Every exportable rating in feedback-id order, `page` at a time (keyset on the id)."""
    base, after = _select(filt), 0
    while True:
        with store.db.session() as s:
            rows = s.execute(base.where(Feedback.id > after).order_by(Feedback.id).limit(page)).all()
        if not rows:
            return
        for r in rows:
            yield _row(r)
        after = rows[-1][0]


def rated_rows_by_prompt(store: Store, filt: ExportFilter = ExportFilter(), page: int = PAGE) -> Iterator[RatedRow]:
    """Every exportable rating ordered by (endpoint, prompt token ids, feedback id): one prompt's ratings
    are contiguous. One streamed query (a server-side cursor on PostgreSQL), `page` rows a fetch."""
    q = _select(filt).order_by(Response.endpoint, Response.prompt_ids, Feedback.id).execution_options(yield_per=page)
    with store.db.session() as s:
        for r in s.execute(q):
            yield _row(r)


# -- shapes -------------------------------------------------------------------------------------------
class Skips(dict):
    def add(self, reason: str) -> None:
        self[reason] = self.get(reason, 0) + 1


class Shaper:
    """Rated rows -> the output rows of one shape (dicts named by the schema's columns)."""

    def __init__(self, shape: str, text: Any, prompt_form: str, history: Callable[[RatedRow], list[dict[str, Any]] | None] | None = None,
                 tools: bool = False, episode: Callable[[str], Any] | None = None):
        if shape != "raw" and text is None:
            raise ExportError(f"shape {shape!r} needs the served model's tokenizer to decode token ids")
        self.shape, self.text, self.form = shape, text, prompt_form
        self.history = history or (lambda r: [])  # a Responses turn's conversation before it (its chain)
        self.tools = tools and prompt_form == "messages"  # the tool-calling shape: rich messages and a `tools` column
        self.episode = episode  # response id -> store.episodes.episode (the `episode` shape)
        self.skipped = Skips()

    def rows(self, rated: Iterable[RatedRow]) -> Iterator[dict[str, Any]]:
        if self.shape == "raw":
            return (_raw(r) for r in rated)
        if self.shape == "preference":
            return self._pairs(rated)
        if self.shape == "episode":
            return self._episodes(rated)
        return self._single(rated)

    def _prompt(self, r: RatedRow) -> Any:
        if r.messages is not None:  # the conversation as asked (tools, calls and results in it)
            conversation = self._conversation(r)
            if conversation is None:
                if self.form == "messages":
                    self.skipped.add("conversation_turn_deleted")
                    return None
                conversation = r.messages
            if (self.form == "text" or self.shape == "episode") and forged_prompt(self.text, r, conversation):
                self.skipped.add("forged_turn")  # the tokens the model saw hold a turn typed as markers
                return None
            if self.form == "messages":
                return [self._message(m) for m in conversation]
        if self.form == "text":
            return self.text.text(r.prompt_ids)
        messages = self.text.messages(self.text.text(r.prompt_ids)) if r.endpoint in CHAT_ENDPOINTS else None
        if messages is None:
            self.skipped.add("prompt_not_chat_messages")
        return messages

    def _conversation(self, r: RatedRow) -> list[dict[str, Any]] | None:
        """A stored conversation whole: a Responses turn's instructions and the turns before it (None:
        one of those was deleted), then its own input."""
        before = self.history(r)
        if before is None:
            return None
        instructions = (r.options or {}).get("instructions") if r.endpoint == "responses" else None
        return ([{"role": "system", "content": instructions}] if instructions else []) + before + r.messages

    def _reply(self, r: RatedRow) -> Any:
        if self.form == "text":
            return self.text.text(r.response_ids)
        if r.output is not None and r.output.get("tool_calls"):
            return [self._message(r.output)]
        return [self._message({"role": "assistant", "content": self.text.completion(r.response_ids)})]

    def _message(self, m: dict[str, Any]) -> dict[str, Any]:
        """A message in the export's message type: role and content; with tools, the call fields too.
        Every text in it escaped (a typed marker tokenizes as plain text)."""
        esc = self.text.escape
        if not self.tools:
            return {"role": m["role"], "content": esc(m.get("content") or "")}
        calls = m.get("tool_calls")
        return {
            "role": m["role"], "content": _mapped(esc, m.get("content")),
            "tool_calls": [{"id": esc(c["id"]), "type": "function", "function": {k: _mapped(esc, v) for k, v in c["function"].items()}}
                           for c in calls] if calls else None,
            "tool_call_id": _mapped(esc, m.get("tool_call_id")), "name": _mapped(esc, m.get("name")),
        }

    def _tools(self, r: RatedRow) -> dict[str, Any]:
        return {"tools": self.text.escape(json.dumps(r.tools)) if r.tools else None} if self.tools else {}

    def _single(self, rated: Iterable[RatedRow]) -> Iterator[dict[str, Any]]:
        for r in rated:
            if self.shape == "sft" and r.reward != 1:
                continue
            prompt = self._prompt(r)
            if prompt is None:
                continue
            meta = {"response_id": r.response_id, "policy_version": r.policy_version, "rated_at": r.rated_at, **self._tools(r)}
            if self.shape == "kto":
                yield {"prompt": prompt, "completion": self._reply(r), "label": r.reward == 1, **meta}
            elif self.form == "messages":
                yield {"messages": prompt + self._reply(r), **meta}
            else:  # TRL's prompt-completion form of SFT data
                yield {"prompt": prompt, "completion": self._reply(r), **meta}

    def _episodes(self, rated: Iterable[RatedRow]) -> Iterator[dict[str, Any]]:
        for r in rated:
            episode = self.episode(r.response_id)
            if episode is None or not episode.complete:
                self.skipped.add("episode_turn_deleted")
                continue
            prompt = self._prompt(r)
            if prompt is None:
                continue
            try:
                lay = episode_layout(episode.turns, episode.prompt_ids)
            except EpisodeMismatch:
                self.skipped.add("episode_mismatch")
                continue
            yield {
                "messages": prompt + self._reply(r), "prompt_ids": lay.prompt_ids.astype(np.int32),
                "completion_ids": lay.response_ids.astype(np.int32), "action_mask": lay.action_mask.astype(np.int8),
                "behavior_logprobs": lay.behavior_logprobs, "versions": lay.versions, "turns": lay.turns,
                "sampling_spans": [{"start": a, "end": b, "sampling": d.to_json()} for a, b, d in lay.sampling_spans],
                "episode_id": episode.turns[0].id, "reward": r.reward, "label": r.reward == 1,
                "response_id": r.response_id, "policy_version": r.policy_version, "rated_at": r.rated_at, **self._tools(r),
            }

    def _pairs(self, rated: Iterable[RatedRow]) -> Iterator[dict[str, Any]]:
        group: list[RatedRow] = []
        for r in rated:
            if group and (r.endpoint != group[0].endpoint or not np.array_equal(r.prompt_ids, group[0].prompt_ids)):
                yield from self._pair(group)
                group = []
            group.append(r)
        yield from self._pair(group)

    def _pair(self, group: list[RatedRow]) -> Iterator[dict[str, Any]]:
        ups = [r for r in group if r.reward == 1]
        downs = [r for r in group if r.reward != 1]
        if not ups or not downs:
            return
        prompt = self._prompt(group[0])
        if prompt is None:
            return
        for k, down in enumerate(downs):
            up = ups[k % len(ups)]
            yield {
                "prompt": prompt, "chosen": self._reply(up), "rejected": self._reply(down),
                "chosen_response_id": up.response_id, "rejected_response_id": down.response_id,
                "chosen_policy_version": up.policy_version, "rejected_policy_version": down.policy_version,
                "rated_at": max(up.rated_at, down.rated_at), **self._tools(group[0]),
            }


def _mapped(f: Callable[[str], str], value: Any) -> Any:
    return f(value) if isinstance(value, str) else value


def _texts(messages: Iterable[dict[str, Any]]) -> Iterator[str]:
    """Every text of a conversation the template renders: contents, names, call ids and arguments."""
    for m in messages:
        yield from (v for v in (m.get("content"), m.get("name"), m.get("tool_call_id")) if isinstance(v, str))
        for c in m.get("tool_calls") or ():
            yield from (v for v in (c.get("id"), *(c.get("function") or {}).values()) if isinstance(v, str))


def forged_prompt(text: Any, r: RatedRow, conversation: list[dict[str, Any]]) -> bool:
    """Whether the prompt tokens of a stored conversation hold a marker its text typed, read as the
    tokenizer's own token (a forged turn): the conversation and its tools hold more markers than the
    prompt's ordinary tokens spell."""
    typed = sum(text.markers(t) for t in _texts(conversation)) + (text.markers(json.dumps(r.tools)) if r.tools else 0)
    return typed > 0 and text.plain_markers(text.text(r.prompt_ids)) < typed


def _raw(r: RatedRow) -> dict[str, Any]:
    return {
        "feedback_id": r.feedback_id, "response_id": r.response_id, "key_id": r.key_id, "reward": r.reward,
        "label": r.reward == 1, "policy_version": r.policy_version,
        "version_spans": [list(s) for s in r.version_spans] if r.version_spans else None,
        "segment": r.segment, "endpoint": r.endpoint, "finish_reason": r.finish_reason,
        "prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "behavior_logprobs": r.behavior_logprobs,
        "sampling": r.sampling.to_json(), "created_at": r.created_at, "rated_at": r.rated_at,
    }


def schema(shape: str, prompt_form: str, tools: bool = False) -> Any:
    """The Parquet (Arrow) schema of a shape (`tools`: the tool-calling message type and column)."""
    import pyarrow as pa

    draw = pa.struct([("temperature", pa.float64()), ("top_p", pa.float64()), ("top_k", pa.int64()), ("min_p", pa.float64()),
                      ("repetition_penalty", pa.float64()), ("min_tokens", pa.int64()), ("logprobs", pa.string())])

    ts = pa.timestamp("us", tz="UTC")
    tools = tools and prompt_form == "messages"
    if tools:
        call = pa.struct([("id", pa.string()), ("type", pa.string()),
                          ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
        text = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(call)),
                                   ("tool_call_id", pa.string()), ("name", pa.string())]))
    elif prompt_form == "messages":
        text = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    else:
        text = pa.string()
    meta = [("response_id", pa.string()), ("policy_version", pa.int64()), ("rated_at", ts)] + ([("tools", pa.string())] if tools else [])
    if shape == "kto":
        return pa.schema([("prompt", text), ("completion", text), ("label", pa.bool_()), *meta])
    if shape == "sft":
        if prompt_form == "messages":
            return pa.schema([("messages", text), *meta])
        return pa.schema([("prompt", text), ("completion", text), *meta])
    if shape == "episode":
        return pa.schema([
            ("messages", text), ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
            ("action_mask", pa.list_(pa.int8())), ("behavior_logprobs", pa.list_(pa.float32())), ("versions", pa.list_(pa.int64())),
            ("turns", pa.int32()),
            ("sampling_spans", pa.list_(pa.struct([("start", pa.int32()), ("end", pa.int32()), ("sampling", draw)]))),
            ("episode_id", pa.string()), ("reward", pa.int8()), ("label", pa.bool_()), *meta,
        ])
    if shape == "preference":
        return pa.schema([
            ("prompt", text), ("chosen", text), ("rejected", text), ("chosen_response_id", pa.string()),
            ("rejected_response_id", pa.string()), ("chosen_policy_version", pa.int64()),
            ("rejected_policy_version", pa.int64()), ("rated_at", ts), *([("tools", pa.string())] if tools else []),
        ])
    return pa.schema([
        ("feedback_id", pa.int64()), ("response_id", pa.string()), ("key_id", pa.string()), ("reward", pa.int8()),
        ("label", pa.bool_()), ("policy_version", pa.int64()), ("version_spans", pa.list_(pa.list_(pa.int64()))),
        ("segment", pa.string()), ("endpoint", pa.string()), ("finish_reason", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())), ("response_ids", pa.list_(pa.int32())),
        ("behavior_logprobs", pa.list_(pa.float32())),
        ("sampling", draw), ("created_at", ts), ("rated_at", ts),
    ])


# -- writing ------------------------------------------------------------------------------------------
def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _write_jsonl(rows: Iterable[dict[str, Any]], f: Any, _schema: Any, _row_group: int) -> int:
    n = 0
    for row in rows:
        f.write(json.dumps(row, default=_json_default, ensure_ascii=False).encode())
        f.write(b"\n")
        n += 1
    return n


def _write_parquet(rows: Iterable[dict[str, Any]], f: Any, arrow_schema: Any, row_group: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, batch = 0, []
    with pq.ParquetWriter(f, arrow_schema, compression="zstd") as writer:
        for row in rows:
            batch.append(row)
            if len(batch) >= row_group:
                writer.write_table(pa.Table.from_pylist(batch, schema=arrow_schema), row_group_size=row_group)
                n, batch = n + len(batch), []
        if batch:  # an empty export: a schema and no row group
            writer.write_table(pa.Table.from_pylist(batch, schema=arrow_schema), row_group_size=row_group)
            n += len(batch)
    return n


WRITERS: dict[str, Callable[[Iterable[dict[str, Any]], Any, Any, int], int]] = {"jsonl": _write_jsonl, "parquet": _write_parquet}


def export(
    store: Store, out: str | Path, fmt: str, shape: str, filt: ExportFilter = ExportFilter(), text: Any = None,
    prompt_form: str = "messages", row_group: int = 4096, page: int = PAGE,
) -> ExportResult:
    """Write the exportable ratings as `shape` rows in `fmt` to `out` (atomically: a temporary name in
    the same directory, renamed when complete). `text`: an `export_text.TokenText` (the trainer shapes)."""
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if shape not in SHAPES:
        raise ExportError(f"shape must be one of {', '.join(SHAPES)}, not {shape!r}")
    if prompt_form not in PROMPT_FORMS:
        raise ExportError(f"prompt form must be one of {', '.join(PROMPT_FORMS)}, not {prompt_form!r}")
    if row_group < 1 or page < 1:
        raise ExportError("row_group and page must be >= 1")
    out = Path(out)
    if out.is_dir():
        raise ExportError(f"--out: {out} is a directory (give a file name)")
    if not out.parent.is_dir():
        raise ExportError(f"--out: the directory {out.parent} does not exist")
    with_tools = shape != "raw" and prompt_form == "messages" and has_tools(store, filt)
    shaper = Shaper(shape, text, prompt_form, functools.partial(_before, store), with_tools, store.episodes.episode)
    counted = _Counted(rated_rows_by_prompt(store, filt, page) if shape == "preference" else rated_rows(store, filt, page))
    started = time.perf_counter()
    try:
        fd, tmp = private_temp(out)  # 0600, an unpredictable name, created exclusively: never another's file or link
    except OSError as exc:
        raise ExportError(f"--out: cannot write in {out.parent}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            n = WRITERS[fmt](shaper.rows(counted), f, schema(shape, prompt_form, with_tools), row_group)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ExportResult(str(out), fmt, shape, n, counted.n, dict(shaper.skipped), time.perf_counter() - started)


def _before(store: Store, r: RatedRow) -> list[dict[str, Any]] | None:
    """The conversation before a Responses turn: every earlier turn's input and output, read along its
    `previous_response_id` chain (None: a turn of it was deleted)."""
    if r.previous_response_id is None:
        return []
    turns = store.conversations.chain(r.previous_response_id, r.owner, (r.endpoint,))
    if turns is None:
        return None
    return [m for t in turns for m in t.messages + ([t.output] if t.output is not None else [])]


class _Counted:
    def __init__(self, rows: Iterator[RatedRow]):
        self._rows, self.n = rows, 0

    def __iter__(self) -> Iterator[RatedRow]:
        for r in self._rows:
            self.n += 1
            yield r


# -- arguments (the CLI's) --------------------------------------------------------------------------
def parse_versions(spec: str) -> frozenset[int]:
    """"3,5-9" -> {3, 5, 6, 7, 8, 9}."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo < 0 or hi < lo or hi - lo > 1_000_000:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                v = int(part)
                if v < 0:
                    raise ValueError
                out.add(v)
        except ValueError:
            raise ExportError(f"--versions: {part!r} is not a version or a range like 5-9 (in {spec!r})") from None
    return frozenset(out)


def parse_time(spec: str, name: str) -> datetime:
    try:
        return _utc(datetime.fromisoformat(spec))
    except ValueError:
        raise ExportError(f"{name}: {spec!r} is not an ISO 8601 time (e.g. 2026-12-01 or 2026-12-01T08:00:00+00:00)") from None


def parse_names(spec: str, name: str) -> frozenset[str]:
    names = frozenset(p.strip() for p in spec.split(",") if p.strip())
    if not names:
        raise ExportError(f"{name}: no names in {spec!r}")
    return names


def to_filter(since: str | None = None, until: str | None = None, versions: str | None = None,
              segments: str | None = None, keys: str | None = None) -> ExportFilter:
    filt = ExportFilter(
        since=parse_time(since, "--since") if since else None, until=parse_time(until, "--until") if until else None,
        versions=parse_versions(versions) if versions else None,
        segments=parse_names(segments, "--segments") if segments else None, keys=parse_names(keys, "--keys") if keys else None,
    )
    if filt.since and filt.until and filt.until <= filt.since:
        raise ExportError("--until must be after --since")
    return filt
