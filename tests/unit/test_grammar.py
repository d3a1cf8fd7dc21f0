"""liveloop.grammar: packed masks of allowed tokens, the masked logits a log-softmax renormalises
over them (hand-computed on a 4-token vocabulary), and a grammar replayed over a token sequence with
the default model's tokenizer."""

from __future__ import annotations

import math

import pytest
import torch

from liveloop.grammar import DISALLOWED, ConstraintViolated, Grammars, InvalidConstraint, mask_logits, unpack


def test_unpack_reads_bit_j_of_word_w_as_token_32w_plus_j():
    # word 0 = 0b101: tokens 0 and 2; word 1 = 1 << 3: token 35; vocab of 36 cuts the rest
    packed = torch.tensor([[0b101, 1 << 3]], dtype=torch.int32)
    allowed = unpack(packed, 36)
    assert allowed.shape == (1, 36)
    assert torch.nonzero(allowed[0]).flatten().tolist() == [0, 2, 35]
    # the sign bit is token 31 (int32 -2**31)
    assert torch.nonzero(unpack(torch.tensor([[-(2**31)]], dtype=torch.int32), 32)[0]).flatten().tolist() == [31]


def test_masked_log_softmax_renormalises_over_the_allowed_tokens():
    logits = torch.tensor([[0.0, math.log(2.0), math.log(3.0), 5.0]], requires_grad=True)
    allowed = torch.tensor([[0b0110]], dtype=torch.int32)  # tokens 1 and 2
    lp = torch.log_softmax(mask_logits(logits, allowed), -1)
    # p(1) = 2 / (2 + 3) = 0.4, p(2) = 0.6; tokens 0 and 3 get (almost) nothing
    assert lp[0, 1].item() == pytest.approx(math.log(0.4), abs=1e-6)
    assert lp[0, 2].item() == pytest.approx(math.log(0.6), abs=1e-6)
    assert lp[0, 0].item() < DISALLOWED / 2 and lp[0, 3].item() < DISALLOWED / 2
    # d log p(1) / d logit: 1 - 0.4 on token 1, -0.6 on token 2, nothing on the forbidden ones
    lp[0, 1].backward()
    assert logits.grad[0].tolist() == pytest.approx([0.0, 0.6, -0.6, 0.0], abs=1e-6)


def test_a_forced_token_has_logprob_zero_and_no_gradient():
    logits = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    lp = torch.log_softmax(mask_logits(logits, torch.tensor([[0b010]], dtype=torch.int32)), -1)
    assert lp[0, 1].item() == 0.0
    lp[0, 1].backward()
    assert logits.grad.abs().max().item() == 0.0


@pytest.fixture(scope="module")
def grammars(model_dir):
    from transformers import AutoTokenizer

    return Grammars(AutoTokenizer.from_pretrained(str(model_dir)), 1024)


def _tag(text: str) -> str:
    from xgrammar.structural_tag import ConstStringFormat, StructuralTag

    return StructuralTag(format=ConstStringFormat(value=text)).model_dump_json()


def test_replaying_a_grammar_gives_each_positions_allowed_tokens(grammars, model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok("yes", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    allowed = grammars.allowed(_tag("yes"), ids)
    assert allowed.shape == (len(ids), grammars.walk(_tag("yes")).words)
    masks = unpack(allowed, 1024)
    for i, t in enumerate(ids):
        assert masks[i, t]  # every token taken was allowed where it was taken
    assert masks[-1].sum().item() == 1  # after the text, only the stop token
    with pytest.raises(ConstraintViolated):
        grammars.allowed(_tag("yes"), tok("no", add_special_tokens=False)["input_ids"])
    with pytest.raises(InvalidConstraint):
        grammars.compile('{"type": "structural_tag", "format": {"type": "nonsense"}}')


def _schema_tag(schema: dict) -> str:
    from xgrammar.structural_tag import JSONSchemaFormat, StructuralTag

    return StructuralTag(format=JSONSchemaFormat(json_schema=schema)).model_dump_json()


def test_a_pattern_that_matches_nothing_is_a_dead_end_where_the_walk_reaches_it(grammars):
    """It compiles (xgrammar checks the regex, not that it matches anything); the walk finds the dead end
    at the string's first character: no token allowed, the grammar not ended."""
    walk = grammars.walk(_schema_tag({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[^\\s\\S]$"}},
                                      "required": ["a"]}))
    steps = 0
    while True:
        mask = unpack(walk.fill()[None], grammars.info.vocab_size)[0]
        if walk.dead_end:
            break
        assert steps < 64, "no dead end"
        assert walk.accept(int(torch.nonzero(mask)[0]))  # any allowed token: the prefix `{"a":"` is forced
        steps += 1
    assert steps > 0 and not walk.finished
    ok = grammars.walk(_schema_tag({"type": "string"}))
    ok.fill()
    assert not ok.dead_end


def test_the_compiled_grammar_cache_is_bounded(model_dir):
    from transformers import AutoTokenizer

    small = Grammars(AutoTokenizer.from_pretrained(str(model_dir)), 1024, cache_limit_bytes=1 << 16)
    for n in range(40):  # bounded: distinct grammars, each cached until the bound evicts the oldest
        small.compile(_schema_tag({"type": "object", "properties": {f"k{n}_{i}": {"type": "integer"} for i in range(8)}}))
    assert 0 < small._compiler.get_cache_size_bytes() <= 2 * (1 << 16)  # xgrammar: "may slightly exceed"
