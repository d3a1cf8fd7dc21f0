"""TextStream on the project's byte-level tokenizer: incremental text, stop strings with hold-back,
multi-byte characters never split."""

import pytest

from liveloop.model.corpus import generate_corpus
from liveloop.model.tokenizer import train_tokenizer
from liveloop.server.edge.pipeline.text import TextStream, token_bytes


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


def test_windowed_decoding_equals_the_full_decode_on_random_tokens(tok):
    """Random ids (half characters, special tokens, odd byte runs) in random delta sizes: the
    incremental text is the full decode, and no piece ends in half a character before the finish."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        ts, pieces, i = TextStream(tok), [], 0
        while i < len(ids):
            n = rng.randrange(1, 4)
            pieces.append(ts.add(ids[i : i + n]))
            i += n
        pieces.append(ts.finish())
        assert "".join(pieces) == ts.text == tok.decode(ids, skip_special_tokens=True)
        assert not any(p.endswith("\ufffd") for p in pieces[:-1])


def test_stop_string_across_deltas_with_the_project_tokenizer(tok):
    ids = tok("Behold! The abyss awaits.", add_special_tokens=False)["input_ids"]
    ts = TextStream(tok, ["abyss aw"])
    out = "".join(ts.add(ids[i : i + 2]) for i in range(0, len(ids), 2)) + ts.finish()
    assert ts.stopped and out == "Behold! The "
