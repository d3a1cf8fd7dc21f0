"""rl/batch.py `scorable`: a sample the learner cannot score (tokens its grammar forbids, ids outside the
vocabulary, non-finite logprobs, arrays of different lengths, ...) is refused with its reason before it
joins a batch; a good one passes with its grammar's masks replayed once, which `make_batch` then uses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from liveloop.grammar import ConstraintViolated, grammars_for
from liveloop.rl.batch import Sample, Unscorable, make_batch, scorable

VOCAB = 1024


def _tag(text: str) -> str:
    from xgrammar.structural_tag import ConstStringFormat, StructuralTag

    return StructuralTag(format=ConstStringFormat(value=text)).model_dump_json()


def _schema_tag(schema: dict) -> str:
    from xgrammar.structural_tag import JSONSchemaFormat, StructuralTag

    return StructuralTag(format=JSONSchemaFormat(json_schema=schema)).model_dump_json()


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def grammars(model_dir):
    return grammars_for(str(model_dir), VOCAB)


def _sample(response=(5, 6, 7), logprobs=None, **kw) -> Sample:
    n = len(response)
    lps = np.full(n, -1.0, np.float32) if logprobs is None else np.asarray(logprobs, np.float32)
    fields = dict(prompt_ids=np.array([1, 2]), response_ids=np.asarray(response, np.int64), behavior_logprobs=lps,
                  action_mask=np.ones(n, np.uint8), reward=1.0, policy_version=0)
    return Sample(**(fields | kw))


def _reason(sample: Sample, grammars=None, **kw) -> str:
    with pytest.raises(Unscorable) as exc:
        scorable(sample, VOCAB, grammars, **kw)
    assert exc.value.reason in Unscorable.REASONS
    return exc.value.reason


def test_a_good_sample_passes_unchanged():
    s = _sample()
    assert scorable(s, VOCAB) is s


def test_each_kind_of_broken_sample_is_refused_with_its_reason():
    assert _reason(_sample(logprobs=[-1.0, -1.0])) == "lengths"
    assert _reason(_sample(action_mask=np.ones(2, np.uint8))) == "lengths"
    assert _reason(_sample(grammar_spans=((1, 9, "g"),))) == "lengths"
    assert _reason(_sample(prompt_ids=np.array([], np.int64))) == "empty_prompt"
    assert _reason(_sample(response=(5, VOCAB, 7))) == "token_ids"
    assert _reason(_sample(response=(5, -1, 7))) == "token_ids"
    assert _reason(_sample(prompt_ids=np.array([1, 5000]))) == "token_ids"
    assert _reason(_sample(prompt_ids=np.array([1.0, 2.0]))) == "token_ids"
    assert _reason(_sample(logprobs=[-1.0, float("-inf"), -1.0])) == "logprobs"
    assert _reason(_sample(logprobs=[-1.0, float("nan"), -1.0])) == "logprobs"
    assert _reason(_sample(reward=float("nan"))) == "reward"
    assert _reason(_sample(version_spans=((0, 5, 1),))) == "versions"


def test_nan_logprobs_mark_on_policy_tokens_where_the_learner_says_so():
    s = _sample(logprobs=[-1.0, float("nan"), -1.0])
    assert scorable(s, VOCAB, nan_logprobs=True) is s
    assert _reason(_sample(logprobs=[-1.0, float("inf"), -1.0]), nan_logprobs=True) == "logprobs"


def test_tokens_their_grammar_forbids_are_refused_not_raised(tok, grammars):
    """The issue's reply: a string schema whose pattern matches nothing compiles, and the engine's
    out-of-grammar token was stored; replaying it raises ConstraintViolated, which `scorable` turns
    into a reason (and `make_batch` alone still raises: the check is what keeps it out)."""
    nothing = _schema_tag({"type": "string", "pattern": "^[^\\s\\S]$"})
    ids = tok('"x"', add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    poison = _sample(response=ids, grammar=nothing)
    assert _reason(poison, grammars) == "grammar"
    with pytest.raises(ConstraintViolated):
        make_batch([poison], grammars=grammars)
    wrong = _sample(response=tok("no", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], grammar=_tag("yes"))
    assert _reason(wrong, grammars) == "grammar"
    spans = _sample(response=wrong.response_ids, grammar_spans=((0, len(wrong.response_ids), _tag("yes")),))
    assert _reason(spans, grammars) == "grammar"
    assert _reason(_sample(grammar="not a structural tag"), grammars) == "grammar"


def test_a_good_constrained_sample_carries_its_masks_into_the_batch(tok, grammars):
    ids = tok("yes", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    good = _sample(response=ids, grammar=_tag("yes"))
    checked = scorable(good, VOCAB, grammars)
    assert checked.masks is not None and torch.equal(checked.masks, grammars.allowed(_tag("yes"), ids))
    assert checked == good  # the masks ride along; the sample is the same sample
    free = _sample()
    batch = make_batch([checked, free])  # no grammars needed: the masks were replayed by the check
    assert torch.equal(batch.allowed[0], checked.masks) and batch.allowed[1] is None
    replayed = make_batch([good, free], grammars=grammars)
    assert torch.equal(replayed.allowed[0], batch.allowed[0])
    assert scorable(dataclasses.replace(good), VOCAB) == good  # without grammars: checked, not replayed
