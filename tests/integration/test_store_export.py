"""`liveloop store export` on real SQLite and PostgreSQL stores: every shape in both formats loads
with `datasets` as TRL reads it; quarantined, forgotten and deleted data never appears whatever the
filters; the filters (versions, segments, keys, time) select what they say; preference pairs are
deterministic; small keyset pages read the same rows; a failed export leaves no file; bad arguments
exit 2 with one line and no traceback."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from liveloop import cli
from liveloop.sampling import Sampling
from liveloop.store import FeedbackRecord, ResponseRecord
from liveloop.store.export import ExportFilter, export, rated_rows
from liveloop.store.export_text import TokenText


def _ids(tok: Tokenizer, s: str) -> tuple[int, ...]:
    return tuple(tok.encode(s, add_special_tokens=False).ids)


def _chat(tok, rid, question, answer, key="key-a", version=0, segment=None, endpoint="chat", sampling=None) -> ResponseRecord:
    prompt = f"<|user|>\n{question}<|end|>\n<|assistant|>\n" if endpoint == "chat" else question
    reply = _ids(tok, answer) + (4,)  # <|end|>
    return ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=version, endpoint=endpoint, prompt_ids=_ids(tok, prompt),
        response_ids=reply, behavior_logprobs=tuple(-0.5 - k / 10 for k in range(len(reply))), finish_reason="stop",
        temperature=1.0, top_p=1.0, latency_ms=1.0, segment=segment, sampling=sampling,
    )


def _seed(store, tok) -> None:
    """Two prompts on v0/v1 by key-a and key-b, one completions row, a segment row."""
    store.versions.add_version(1, parent=0, checkpoint_path="/c/1", status="published")
    recs = [
        _chat(tok, "a-up", "hello?", "hi there"),
        _chat(tok, "a-down", "hello?", "go away"),
        _chat(tok, "a-up2", "hello?", "hello friend", version=1, sampling=Sampling(temperature=0.7, top_p=0.9)),
        _chat(tok, "b-down", "weather?", "no idea", key="key-b", version=1),
        _chat(tok, "c-up", "plain text prompt", " continued", endpoint="completion"),
        _chat(tok, "s-up", "segment q?", "segment a", segment="fr", version=1),
    ]
    assert store.feedback.write_batch(recs) == [r.id for r in recs]
    rates = [("a-up", "key-a", 1), ("a-down", "key-a", 0), ("a-up2", "key-a", 1), ("b-down", "key-b", 0), ("c-up", "key-a", 1), ("s-up", "key-a", 1)]
    out = store.feedback.write_batch([FeedbackRecord(r, k, v) for r, k, v in rates])
    assert not [o for o in out if isinstance(o, Exception)]


def _load(path: Path, fmt: str) -> list[dict]:
    ds = datasets.load_dataset("parquet" if fmt == "parquet" else "json", data_files=str(path), split="train")
    return list(ds)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_every_shape_loads_with_datasets(store, tok, text, tmp_path, fmt):
    _seed(store, tok)
    kto = export(store, tmp_path / f"kto.{fmt}", fmt, "kto", text=text)
    assert (kto.rows, kto.ratings_read, kto.skipped) == (5, 6, {"prompt_not_chat_messages": 1})  # the completions row
    rows = {r["response_id"]: r for r in _load(tmp_path / f"kto.{fmt}", fmt)}
    assert set(rows) == {"a-up", "a-down", "a-up2", "b-down", "s-up"}
    assert rows["a-up"]["prompt"] == [{"role": "user", "content": "hello?"}]
    assert rows["a-up"]["completion"] == [{"role": "assistant", "content": "hi there"}]
    assert rows["a-up"]["label"] is True and rows["a-down"]["label"] is False and rows["a-up2"]["policy_version"] == 1
    assert rows["a-up"]["rated_at"]  # metadata on every row

    pref = export(store, tmp_path / f"pref.{fmt}", fmt, "preference", text=text)
    (pair,) = _load(tmp_path / f"pref.{fmt}", fmt)  # only "hello?" has both labels: one down, paired with the first up
    assert pref.rows == 1 and (pair["chosen_response_id"], pair["rejected_response_id"]) == ("a-up", "a-down")
    assert pair["prompt"] == [{"role": "user", "content": "hello?"}] and pair["rejected"] == [{"role": "assistant", "content": "go away"}]

    export(store, tmp_path / f"sft.{fmt}", fmt, "sft", text=text)
    sft = {r["response_id"]: r for r in _load(tmp_path / f"sft.{fmt}", fmt)}
    assert set(sft) == {"a-up", "a-up2", "s-up"}
    assert sft["a-up2"]["messages"] == [{"role": "user", "content": "hello?"}, {"role": "assistant", "content": "hello friend"}]

    export(store, tmp_path / f"raw.{fmt}", fmt, "raw")
    raw = {r["response_id"]: r for r in _load(tmp_path / f"raw.{fmt}", fmt)}
    assert len(raw) == 6 and raw["s-up"]["segment"] == "fr" and raw["c-up"]["endpoint"] == "completion"
    stored = store.feedback.get_response("a-down")
    assert raw["a-down"]["prompt_ids"] == stored.prompt_ids.tolist() and raw["a-down"]["response_ids"] == stored.response_ids.tolist()
    assert raw["a-down"]["behavior_logprobs"] == pytest.approx(stored.behavior_logprobs.tolist())
    assert raw["a-down"]["key_id"] == "key-a" and raw["a-down"]["reward"] == 0 and raw["a-down"]["version_spans"] is None
    # how each was drawn: what its behaviour logprobs are the distribution of (a row without a record: raw)
    assert Sampling.from_json(raw["a-up2"]["sampling"]) == Sampling(temperature=0.7, top_p=0.9)
    assert Sampling.from_json(raw["a-down"]["sampling"]) == Sampling.logged_raw(1.0, 1.0)


def test_text_form_keeps_every_row_as_the_model_saw_it(store, tok, text, tmp_path):
    _seed(store, tok)
    result = export(store, tmp_path / "kto.parquet", "parquet", "kto", text=text, prompt_form="text")
    assert result.rows == 6 and result.skipped == {}
    rows = {r["response_id"]: r for r in pq.read_table(tmp_path / "kto.parquet").to_pylist()}
    assert rows["c-up"]["prompt"] == "plain text prompt" and rows["c-up"]["completion"] == " continued<|end|>"
    assert rows["a-up"]["prompt"] == "<|user|>\nhello?<|end|>\n<|assistant|>\n"


def test_quarantined_forgotten_and_deleted_data_never_appears(store, tok, text, tmp_path):
    _seed(store, tok)
    store.feedback.write_batch([_chat(tok, "q-up", "quarantine me?", "yes", key="key-q"), _chat(tok, "f-up", "forget me?", "ok", key="key-f")])
    store.feedback.write_batch([FeedbackRecord("q-up", "key-q", 1), FeedbackRecord("f-up", "key-f", 1)])
    assert len(list(rated_rows(store))) == 8
    store.keys.set_quarantined("key-q", True, "test")  # kept in the store, never exported
    store.rights.forget_key("key-f")
    store.rights.delete_response("b-down", "key-b")
    raw = [r.response_id for r in rated_rows(store)]
    assert sorted(raw) == ["a-down", "a-up", "a-up2", "c-up", "s-up"]
    # no filter lets them back in
    assert [r.response_id for r in rated_rows(store, ExportFilter(keys=frozenset({"key-q", "key-f", "key-b"})))] == []
    export(store, tmp_path / "raw.jsonl", "jsonl", "raw")
    lines = (tmp_path / "raw.jsonl").read_text().splitlines()
    assert len(lines) == 5 and not any(k in line for line in lines for k in ("key-q", "key-f", "q-up", "f-up", "b-down"))


def test_filters_select_what_they_say(store, tok, tmp_path):
    _seed(store, tok)
    def ids(**kw) -> list[str]:
        return sorted(r.response_id for r in rated_rows(store, ExportFilter(**kw)))

    assert ids(versions=frozenset({1})) == ["a-up2", "b-down", "s-up"]
    assert ids(segments=frozenset({"fr"})) == ["s-up"]
    assert ids(keys=frozenset({"key-b"})) == ["b-down"]
    now = datetime.now(timezone.utc)
    assert len(ids(since=now - timedelta(hours=1))) == 6 and ids(since=now + timedelta(hours=1)) == []
    assert ids(until=now - timedelta(hours=1)) == [] and len(ids(until=now + timedelta(hours=1))) == 6
    # keyset pages of 1 and 2 read the same rows in the same order as one page
    assert [r.feedback_id for r in rated_rows(store, page=1)] == [r.feedback_id for r in rated_rows(store, page=2)] == \
        [r.feedback_id for r in rated_rows(store)]


def test_preference_pairs_each_down_with_the_ups_in_turn(store, tok, text, tmp_path):
    recs = [_chat(tok, f"u{i}", "same?", f"up {i}") for i in range(2)] + [_chat(tok, f"d{i}", "same?", f"down {i}") for i in range(3)]
    store.feedback.write_batch(recs)
    store.feedback.write_batch([FeedbackRecord(f"d{i}", "key-a", 0) for i in range(3)] + [FeedbackRecord(f"u{i}", "key-a", 1) for i in range(2)])
    result = export(store, tmp_path / "p.jsonl", "jsonl", "preference", text=text)
    pairs = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    got = [(p["chosen_response_id"], p["rejected_response_id"]) for p in pairs]
    assert got == [("u0", "d0"), ("u1", "d1"), ("u0", "d2")] and result.rows == 3 and result.ratings_read == 5


def test_a_failed_export_leaves_no_file(store, tok, text, tmp_path):
    _seed(store, tok)

    class Broken(TokenText):
        def __init__(self, inner):
            self.inner, self.n = inner, 0

        def text(self, ids):
            self.n += 1
            if self.n > 3:
                raise RuntimeError("tokenizer gone")
            return self.inner.text(ids)

        def messages(self, prompt):
            return self.inner.messages(prompt)

        def completion(self, ids):
            return self.inner.completion(ids)

    out = tmp_path / "out"
    out.mkdir()
    (out / "kto.parquet").write_bytes(b"the previous export")
    with pytest.raises(RuntimeError):
        export(store, out / "kto.parquet", "parquet", "kto", text=Broken(text), row_group=1)
    assert (out / "kto.parquet").read_bytes() == b"the previous export"  # untouched, not half-replaced
    assert [p.name for p in out.iterdir()] == ["kto.parquet"]  # no temporary file left


BAD = [
    (["--versions", "3,x-9"], "--versions"),
    (["--since", "yesterday"], "--since"),
    (["--since", "2026-12-02", "--until", "2026-12-01"], "--until"),
    (["--keys", ","], "--keys"),
    (["--out", "/nonexistent-dir/x.parquet"], "does not exist"),
    (["--model", "/nonexistent-model"], "tokenizer.json"),
]


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, model_dir):
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert cli.main(["store", "migrate", "--url", url]) == 0
    capsys.readouterr()
    for argv, message in BAD:
        args = ["store", "export", "--url", url, "--shape", "kto"]
        if "--out" not in argv:
            args += ["--out", str(tmp_path / "x.parquet")]
        if "--model" not in argv:  # the tests' model: not the default's, which a test before may or may not have imported
            args += ["--model", str(model_dir)]
        assert cli.main(args + argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not (tmp_path / "x.parquet").exists()


def test_cli_exports_and_says_what_it_wrote(store_url, store, tok, model_dir, tmp_path, capsys):
    _seed(store, tok)
    out = tmp_path / "kto.parquet"
    assert cli.main(["store", "export", "--url", store_url, "--format", "parquet", "--shape", "kto", "--out", str(out),
                     "--versions", "1", "--model", str(model_dir)]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["rows"] == 3 and said["path"] == str(out)
    assert sorted(pq.read_table(out).column("response_id").to_pylist()) == ["a-up2", "b-down", "s-up"]


TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Add.", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"a": 2}'}}


def _turn(tok, rid, endpoint, messages, output, previous=None, options=None, tools=TOOLS) -> ResponseRecord:
    reply = _ids(tok, "x") + (4,)
    return ResponseRecord(
        id=rid, api_key_id="key-a", model="m", policy_version=0, endpoint=endpoint, prompt_ids=_ids(tok, "p"), response_ids=reply,
        behavior_logprobs=(-0.5,) * len(reply), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0,
        messages=messages, tools=tools, output=output, previous_response_id=previous, options=options,
    )


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_tool_conversations_export_in_trls_tool_calling_shape(store, tok, text, tmp_path, fmt, model_dir):
    ask = [{"role": "user", "content": "2 + 2?"}]
    called = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "4", "name": "calc"}
    store.feedback.write_batch([
        _turn(tok, "chat-call", "chat", ask, called),
        _turn(tok, "chat-after", "chat", ask + [called, answer], {"role": "assistant", "content": "It is 4."}),
        _turn(tok, "resp-1", "responses", ask, called, options={"instructions": "Be brief."}),
        _turn(tok, "resp-2", "responses", [answer], {"role": "assistant", "content": "4."}, previous="resp-1", options={"instructions": "Short."}),
        _turn(tok, "msg-1", "messages", ask, called),
    ])
    store.feedback.write_batch([FeedbackRecord(r, "key-a", 1) for r in ("chat-call", "chat-after", "resp-2", "msg-1")])
    result = export(store, tmp_path / f"sft.{fmt}", fmt, "sft", text=text)
    assert result.rows == 4 and result.skipped == {}
    rows = {r["response_id"]: r for r in _load(tmp_path / f"sft.{fmt}", fmt)}

    def plain(messages):  # the optional fields a message type holds, dropped where empty
        return [{k: v for k, v in m.items() if v is not None} for m in messages]

    assert plain(rows["chat-call"]["messages"]) == plain(ask + [called])
    assert json.loads(rows["chat-call"]["tools"]) == TOOLS
    assert plain(rows["chat-after"]["messages"]) == plain(ask + [called, answer, {"role": "assistant", "content": "x"}])
    # a Responses turn: its instructions, the turns before it (the chain), its own input, its reply
    assert plain(rows["resp-2"]["messages"]) == plain([{"role": "system", "content": "Short."}] + ask + [called, answer, {"role": "assistant", "content": "x"}])
    assert plain(rows["msg-1"]["messages"]) == plain(ask + [called])  # an Anthropic conversation exports too
    # TRL renders it through the model's template, tools and all
    from transformers import AutoTokenizer
    from trl.data_utils import apply_chat_template

    rendered = apply_chat_template({"messages": plain(rows["chat-after"]["messages"])}, AutoTokenizer.from_pretrained(str(model_dir)),
                                   tools=json.loads(rows["chat-after"]["tools"]))["text"]
    assert '<tool_call>\n{"name": "calc", "arguments": {"a": 2}}\n</tool_call>' in rendered and "<tools>" in rendered
    # a deleted earlier turn takes the later one (its conversation carries it), rating and all
    store.rights.delete_response("resp-1", "key-a")
    assert store.feedback.get_response("resp-2") is None
    again = export(store, tmp_path / f"again.{fmt}", fmt, "sft", text=text)
    assert again.rows == 3 and again.skipped == {}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_episode_exports_whole_with_its_action_mask(store, tok, text, tmp_path, fmt):
    from liveloop.store.linking import LinkKeys

    ask = [{"role": "user", "content": "2 + 2?"}]
    called = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "4", "name": "calc"}
    end = 4  # <|end|>
    p1, r1 = _ids(tok, "p"), _ids(tok, "call") + (end,)
    p2, r2 = p1 + r1 + _ids(tok, "four"), _ids(tok, "It is 4.") + (end,)

    def turn(rid, prompt, reply, messages, output, draw):
        return ResponseRecord(
            id=rid, api_key_id="key-a", model="m", policy_version=0, endpoint="chat", prompt_ids=prompt, response_ids=reply,
            behavior_logprobs=(-0.5,) * len(reply), finish_reason="stop", temperature=draw.temperature, top_p=draw.top_p,
            latency_ms=1.0, messages=messages, tools=TOOLS, output=output, link=LinkKeys.of(prompt, reply, (end,)), sampling=draw,
        )

    hot, plain_draw = Sampling(temperature=1.3, top_p=0.9, top_k=5), Sampling()  # the agent drew each turn its own way
    store.feedback.write_batch([turn("e1", p1, r1, ask, called, hot)])
    store.feedback.write_batch([turn("e2", p2, r2, ask + [called, answer], {"role": "assistant", "content": "It is 4."}, plain_draw)])
    store.feedback.write_batch([FeedbackRecord("e2", "key-a", 1)])
    result = export(store, tmp_path / f"ep.{fmt}", fmt, "episode", text=text)
    assert result.rows == 1 and result.skipped == {}
    (row,) = _load(tmp_path / f"ep.{fmt}", fmt)
    assert (row["turns"], row["episode_id"], row["response_id"], row["label"]) == (2, "e1", "e2", True)
    assert list(row["prompt_ids"]) == list(p1) and list(row["completion_ids"]) == list(r1 + _ids(tok, "four") + r2)
    observed = len(_ids(tok, "four"))
    assert list(row["action_mask"]) == [1] * len(r1) + [0] * observed + [1] * len(r2)
    second = len(r1) + observed  # each trained turn's tokens with the draw they came from
    assert [(d["start"], d["end"], Sampling.from_json(d["sampling"])) for d in row["sampling_spans"]] == [
        (0, len(r1), hot), (second, second + len(r2), plain_draw)]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "calc" and json.loads(row["tools"]) == TOOLS
