"""The hf engine in-process on the tiny default model: constrained decoding (a forced call's tokens
follow its grammar, their logprobs are the masked distribution's, a property over random schemas and
tool names) and vLLM's sampling extensions (top_k, min_p, repetition_penalty, min_tokens), each token's
logprob that of the distribution it was drawn from."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from liveloop.grammar import Grammars, mask_logits
from liveloop.sampling import Sampling, draw_logits
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.edge.formats.tool_parsers import PARSERS
from liveloop.server.edge.formats.tools import Tool, ToolChoice, ToolUse

PROMPT = (5, 6, 7, 8)


@pytest.fixture(scope="module")
def engine(model_dir):
    import asyncio

    loop = asyncio.new_event_loop()
    eng = HFEngine(EngineConfig(backend="hf", model=str(model_dir)), model_dir)
    loop.run_until_complete(eng.start())
    yield eng, loop
    loop.run_until_complete(eng.close())
    loop.close()


def _run(engine, sampling: SamplingParams, rid: str = "r") -> tuple[list[int], list[float], str]:
    eng, loop = engine

    async def go():
        ids, lps, finish = [], [], None
        async with eng.generate(GenerationRequest(rid, PROMPT, sampling)) as gen:
            async for d in gen:
                ids += d.token_ids
                lps += d.logprobs
                finish = d.finish_reason
        return ids, lps, finish

    return loop.run_until_complete(go())


def _text(engine, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(engine[0].model_path).decode(ids, skip_special_tokens=True)


@torch.no_grad()
def _masked_forward(engine, constraint: str, ids: list[int], sampling: Sampling | None = None) -> torch.Tensor:
    from transformers import AutoTokenizer

    model = engine[0].model
    grammars = Grammars(AutoTokenizer.from_pretrained(engine[0].model_path), model.config.vocab_size)
    logits = model(input_ids=torch.tensor([list(PROMPT) + ids])).logits[0, len(PROMPT) - 1 : -1].float()
    masked = mask_logits(logits, grammars.allowed(constraint, ids))
    lp = torch.log_softmax(masked if sampling is None else draw_logits(masked, sampling, keep=torch.tensor(ids)), -1)
    return lp.gather(1, torch.tensor(ids)[:, None])[:, 0]


def _stop(engine) -> tuple[int, ...]:
    return (int(engine[0].model.config.eos_token_id),)


schemas = st.sampled_from([
    {"type": "object", "properties": {"op": {"enum": ["add", "mul", "neg"]}}, "required": ["op"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
     "required": ["n", "b"], "additionalProperties": False},
    {"type": "object", "properties": {"k": {"enum": ["x", "yy"]}, "v": {"type": "integer", "minimum": -5, "maximum": 5}},
     "required": ["k"], "additionalProperties": False},
    {"type": "object", "properties": {}, "additionalProperties": False},
])
names = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=schemas, name=names, other=names, seed=st.integers(0, 2**31 - 1), named=st.booleans())
def test_a_forced_call_from_the_engine_always_parses_against_its_schema(engine, schema, name, other, seed, named):
    bounded = {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"], "additionalProperties": False}
    tools = (Tool(name, None, schema),) + ((Tool(other, None, bounded),) if other != name else ())
    choice = ToolChoice("named", name) if named else ToolChoice("required")
    use = ToolUse(tools, choice, False, PARSERS["hermes"]([t.name for t in tools]))
    constraint = use.constraint("canonical")
    ids, lps, finish = _run(engine, SamplingParams(max_tokens=200, seed=seed, temperature=1.3, stop_token_ids=_stop(engine), constraint=constraint))
    assert finish == "stop", _text(engine, ids)  # the grammar ends with the stop token
    (call,) = use.parse(_text(engine, ids)).calls
    assert call.name == name or (not named and call.name == other)
    jsonschema.validate(json.loads(call.arguments), schema if call.name == name else bounded)
    # the behaviour logprobs are the masked, tempered distribution's: what the learner recomputes
    assert torch.allclose(torch.tensor(lps), _masked_forward(engine, constraint, ids, Sampling(temperature=1.3)), atol=1e-4)


def test_top_k_one_is_greedy_and_min_p_one_is_greedy(engine):
    greedy, _, _ = _run(engine, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=()))
    assert _run(engine, SamplingParams(max_tokens=12, temperature=1.0, top_k=1, seed=3, stop_token_ids=()))[0] == greedy
    assert _run(engine, SamplingParams(max_tokens=12, temperature=1.0, min_p=1.0, seed=4, stop_token_ids=()))[0] == greedy


def _forward(engine, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return engine[0].model(input_ids=torch.tensor([list(PROMPT) + ids])).logits[0, len(PROMPT) - 1 : -1].float()


def test_min_tokens_holds_the_stop_token_back_and_logprobs_are_the_draws(engine):
    stop = _stop(engine)
    for seed in range(4):
        ids, lps, finish = _run(engine, SamplingParams(max_tokens=40, seed=seed, min_tokens=30, stop_token_ids=stop))
        assert len(ids) >= 30 and not set(ids[:30]) & set(stop)
    # a greedy reply that stops early goes on under min_tokens; its logprobs are those of the distribution
    # it was drawn from (vLLM's processed logprobs): the stop tokens out of it for the first 30
    ids, lps, _ = _run(engine, SamplingParams(max_tokens=40, temperature=0.0, min_tokens=30, stop_token_ids=stop))
    logits = _forward(engine, ids)
    logits[:30, list(stop)] = float("-inf")
    drawn = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lps), drawn, atol=1e-4)


def test_repetition_penalty_shapes_the_draw_and_its_logprob(engine):
    plain, _, _ = _run(engine, SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=()))
    penalised, lps, _ = _run(engine, SamplingParams(max_tokens=30, temperature=0.0, repetition_penalty=5.0, stop_token_ids=()))
    assert penalised != plain
    # a strong penalty makes a greedy reply avoid repeating its tokens far more than the plain one does
    assert len(set(penalised)) > len(set(plain))
    # vLLM's penalty over the prompt and the reply so far: a positive logit / 5, a negative one * 5
    logits = _forward(engine, penalised)
    for t in range(len(penalised)):
        seen = torch.tensor(sorted(set(PROMPT) | set(penalised[:t])))
        v = logits[t, seen]
        logits[t, seen] = torch.where(v > 0, v / 5.0, v * 5.0)
    drawn = torch.log_softmax(logits, -1).gather(1, torch.tensor(penalised)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lps), drawn, atol=1e-4)


def test_a_grammar_dead_end_ends_its_request_alone(engine):
    """A schema whose pattern matches nothing compiles; the walk reaches its dead end after `{"a":"`.
    That request ends with GrammarDeadEnd; another generating in the same batch runs to its end."""
    import asyncio

    from xgrammar.structural_tag import JSONSchemaFormat, StructuralTag

    from liveloop.grammar import GrammarDeadEnd

    eng, loop = engine
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[^\\s\\S]$"}}, "required": ["a"]}
    dead = StructuralTag(format=JSONSchemaFormat(json_schema=schema, max_whitespace_cnt=1)).model_dump_json()  # no endless spaces

    async def one(rid: str, sampling: SamplingParams):
        ids = []
        try:
            async with eng.generate(GenerationRequest(rid, PROMPT, sampling)) as gen:
                async for d in gen:
                    ids += d.token_ids
        except GrammarDeadEnd as exc:
            return ids, exc
        return ids, None

    async def both():
        return await asyncio.gather(
            one("dead", SamplingParams(max_tokens=40, temperature=1.0, seed=1, constraint=dead)),
            one("free", SamplingParams(max_tokens=24, temperature=1.0, seed=2)),  # no stop token: all 24
        )

    (dead_ids, dead_error), (free_ids, free_error) = loop.run_until_complete(both())
    assert isinstance(dead_error, GrammarDeadEnd), (dead_ids, _text(engine, dead_ids), dead_error)
    assert "".join(_text(engine, dead_ids).split()) == '{"a":"'
    assert free_error is None and len(free_ids) == 24
