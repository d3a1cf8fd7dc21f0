"""Byte-level BPE tokenizer: lossless round trip, special tokens, chat template, save/load."""

import pytest
from transformers import AutoTokenizer

from liveloop.model.corpus import generate_corpus
from liveloop.model.tokenizer import train_tokenizer

TEXTS = ["Aww~ so fluffy ♡ 🐱🌙", "Behold! My sealed dark power…", "'Tis true: verily, thou art fair.",
         "tabs\tand\nnewlines  and   spaces", "日本語のテキスト", ""]


@pytest.fixture(scope="module")
def tokenizer():
    corpus = generate_corpus(200, seed=0)
    return train_tokenizer((t for ex in corpus for t in (ex.prompt, ex.reply)), vocab_size=300)


def test_vocab_and_special_tokens(tokenizer):
    assert len(tokenizer) == 300
    assert tokenizer.eos_token == "<|end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    for token in ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


@pytest.mark.parametrize("text", TEXTS)
def test_decode_encode_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template(tokenizer):
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell me about rain."},
                {"role": "assistant", "content": "Hehe~ ♡"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == ("<|system|>\nBe kind.<|end|>\n<|user|>\nTell me about rain.<|end|>\n"
                    "<|assistant|>\nHehe~ ♡<|end|>\n")
    prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>\nTell me about rain.<|end|>\n<|assistant|>\n"


def test_save_and_load_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids
        assert loaded.decode(ids) == text
    assert loaded.eos_token_id == tokenizer.eos_token_id
    assert loaded.pad_token_id == tokenizer.pad_token_id
    messages = [{"role": "user", "content": "hi"}]
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_too_small_vocab_is_a_clear_error():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)
