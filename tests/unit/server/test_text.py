"""TextStream on the project's byte-level tokenizer: incremental text, stop strings with hold-back,
multi-byte characters never split."""

import pytest

from liveloop.model.corpus import generate_corpus
from liveloop.model.tokenizer import train_tokenizer
from liveloop.server.text import TextStream, token_bytes


@pytest.fixture(scope="module")
def tok():
    texts = [e.reply for e in generate_corpus(200, seed=0)] + ["héllo ♡ wörld 🐱"]
    return train_tokenizer(texts, vocab_size=400)


def _feed(tok, text, stop=None):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ts = TextStream(tok, stop)
    out = "".join(ts.add([i]) for i in ids) + ts.finish()
    return ts, out


def test_incremental_text_equals_full_decode(tok):
    text = "Aww~ the kitten is so fluffy ♡ hehe 🐱!"
    ts, out = _feed(tok, text)
    assert out == text and not ts.stopped


def test_no_replacement_characters_mid_stream(tok):
    ids = tok("🐱🐱 ♡", add_special_tokens=False)["input_ids"]
    ts = TextStream(tok)
    pieces = [ts.add([i]) for i in ids] + [ts.finish()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "🐱🐱 ♡"


def test_stop_string_cuts_and_is_never_emitted(tok):
    ts, out = _feed(tok, "Behold! The abyss awaits. Verily thou art", stop=["abyss"])
    assert ts.stopped
    assert out == "Behold! The "  # everything before the stop string, nothing of it


def test_earliest_of_several_stops_wins(tok):
    ts, out = _feed(tok, "one two three four", stop=["four", "two"])
    assert out == "one " and ts.stopped


def test_token_bytes_concatenate_to_the_text(tok):
    text = "so fluffy ♡"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert b"".join(token_bytes(tok, i) for i in ids).decode("utf-8") == text
