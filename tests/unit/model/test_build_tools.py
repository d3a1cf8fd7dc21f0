"""Tool dialogues in the build: opt-in, the default corpus untouched, only assistant turns learned."""

import dataclasses
import hashlib
import json

import pytest
import torch

from liveloop.model.build import _tokenize_dialogue, build_corpus, build_model
from liveloop.model.config import ModelBuildConfig
from liveloop.model.corpus import generate_corpus
from liveloop.model.tokenizer import train_tokenizer
from liveloop.model.tool_corpus import Move, dialogue_texts, generate_tool_corpus, tool_specs

torch.set_num_threads(1)
TINY = ModelBuildConfig(corpus_size=200, vocab_size=400, num_layers=2, train_steps=20, batch_size=8, seq_len=256,
                        tool_fraction=0.3)
# sha256 of the default config's corpus (6000 examples, seed 0) as it was before tool dialogues existed:
# the built default model (models/liveloop-tiny) stays the same weights only if this stays
DEFAULT_CORPUS_SHA256 = "67b355f008e1e56b6f669d270796c2480684c24b38eb3bca11158c63e78e810d"


def test_tool_fraction_is_validated():
    assert ModelBuildConfig().tool_fraction == 0.0
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="tool_fraction"):
            ModelBuildConfig(tool_fraction=bad)


def test_default_corpus_is_unchanged():
    examples, dialogues = build_corpus(ModelBuildConfig())
    assert dialogues == []
    assert examples == generate_corpus(6000, 0)
    rows = [[e.prompt, e.reply, e.topic, e.style] for e in examples]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == DEFAULT_CORPUS_SHA256


def test_tool_fraction_takes_its_share_of_the_corpus():
    examples, dialogues = build_corpus(dataclasses.replace(TINY, corpus_size=1000, tool_fraction=0.25))
    assert (len(examples), len(dialogues)) == (750, 250)
    assert dialogues == generate_tool_corpus(250, TINY.seed)
    examples, dialogues = build_corpus(dataclasses.replace(TINY, tool_fraction=1.0))
    assert (len(examples), len(dialogues)) == (0, 200)


def test_a_dialogue_learns_its_assistant_turns_only():
    dialogues = generate_tool_corpus(40, seed=0)
    tokenizer = train_tokenizer((t for d in dialogues for t in dialogue_texts(d)), vocab_size=400)
    for d in dialogues[:20]:
        ids, mask = _tokenize_dialogue(d, tokenizer)
        assert len(ids) == len(mask)
        learned = tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assistant = [m for m in d.messages if m["role"] == "assistant"]
        if d.move == Move.DIRECT:
            assert learned == assistant[0]["content"] + "<|end|>"
        else:
            call = assistant[0]["tool_calls"][0]["function"]
            written = json.dumps({"name": call["name"], "arguments": call["arguments"]})
            assert learned == f"<tool_call>\n{written}\n</tool_call><|end|>{assistant[1]['content']}<|end|>"
        # the sequence is the rendered conversation, token for token
        whole = tokenizer.apply_chat_template(list(d.messages), tools=tool_specs(), tokenize=False)
        assert tokenizer.decode(ids) == whole


def test_a_tool_build_records_its_dialogues(tmp_path):
    built = build_model(TINY, tmp_path / "tools", progress=False)
    record = json.loads((built / "liveloop_build.json").read_text())
    stats = record["tool_dialogues"]
    assert stats["count"] == 60 and sum(stats["moves"].values()) == 60
    assert stats["truncated"] == 0 and stats["max_tokens"] <= TINY.seq_len
    assert record["config"]["tool_fraction"] == 0.3
    assert record["final_loss"] < record["first_loss"]


def test_a_short_seq_len_warns_that_dialogues_are_cut(tmp_path):
    with pytest.warns(UserWarning, match="seq_len=64 cuts tool dialogues"):
        build_model(dataclasses.replace(TINY, seq_len=64, train_steps=2), tmp_path / "short", progress=False)
