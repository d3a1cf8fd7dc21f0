"""Token in, token out (server/edge/pipeline/splicing.py) with the tiny model's tokenizer and a real SQLite store: a
resent conversation carrying an earlier turn's text gets that turn's sampled tokens, even where the
tokenizer would have merged them otherwise; another key's turn, a text that does not decode back and a
store that cannot be read all leave the prompt tokenized whole (the last one counted); a conversation
without an assistant message carries nothing, so the server does not look (`carries`)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from liveloop.metrics import Metrics
from liveloop.server.edge.pipeline.splicing import Splicer, carries
from liveloop.store import ResponseRecord
from liveloop.store.linking import LinkKeys


@pytest.fixture(scope="module")
def tok(model_dir):
    return AutoTokenizer.from_pretrained(str(model_dir))


def _served(store, splicer, tok, rid, prompt_text, reply_ids, key="k1"):
    prompt = splicer.prompt_ids(prompt_text, key)
    stops = splicer.stop_ids
    store.feedback.write_batch([ResponseRecord(
        rid, key, "m", 0, "chat", tuple(prompt), tuple(reply_ids), (-1.0,) * len(reply_ids), "stop", 1.0, 1.0, 1.0,
        link=LinkKeys.of(prompt, reply_ids, stops, splicer.text_hash(prompt_text, reply_ids)),
    )])
    return prompt


def _chars(tok, text):  # `text` one character a token: not how the tokenizer would write it
    return [tok.convert_tokens_to_ids(tok.tokenize(c))[0] for c in text]


def test_a_resent_conversation_gets_the_sampled_tokens_back(store, tok):
    splicer = Splicer(tok, [tok.eos_token_id], store.episodes.carried_turn, Metrics())
    system = tok.apply_chat_template([{"role": "user", "content": "hi there"}], add_generation_prompt=True, tokenize=False)
    reply = _chars(tok, "the cat naps") + [tok.eos_token_id]
    first = _served(store, splicer, tok, "t1", system, reply)
    resent = tok.apply_chat_template([{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "the cat naps"},
                                      {"role": "user", "content": "more"}], add_generation_prompt=True, tokenize=False)
    whole = tok(resent, add_special_tokens=False)["input_ids"]
    assert whole[: len(first) + len(reply) - 1] != first + reply[:-1]  # re-tokenized, the reply is other tokens
    spliced = splicer.prompt_ids(resent, "k1")
    assert spliced[: len(first) + len(reply) - 1] == first + reply[:-1]
    assert tok.decode(spliced, skip_special_tokens=False, clean_up_tokenization_spaces=False) == resent
    assert splicer.prompt_ids(resent, "k2") == whole  # another key's turn is not carried
    _served(store, splicer, tok, "t2", resent, _chars(tok, "ok") + [tok.eos_token_id])
    assert store.feedback.get_response("t2").parent_id == "t1"  # and the store links the turns exactly


def test_a_store_that_cannot_be_read_leaves_the_prompt_whole(tok):
    def down(key, hashes):
        raise ConnectionError("the database is unreachable")

    metrics = Metrics()
    splicer = Splicer(tok, [tok.eos_token_id], down, metrics)
    text = tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                    {"role": "user", "content": "c"}], add_generation_prompt=True, tokenize=False)
    assert splicer.prompt_ids(text, "k1") == tok(text, add_special_tokens=False)["input_ids"]
    assert b"server_splice_failures_total 1.0" in metrics.render() or b"server_splice_failures 1.0" in metrics.render(), metrics.render()


def test_only_a_conversation_with_an_assistant_message_can_carry_a_turn():
    """A served turn comes back as an assistant message: a first turn (system, user, tool results of a
    client's own) costs no store read."""
    assert not carries([{"role": "user", "content": "hi"}])
    assert not carries([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert carries([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}])
    assert carries([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "tool", "tool_call_id": "c", "content": "4"}])
