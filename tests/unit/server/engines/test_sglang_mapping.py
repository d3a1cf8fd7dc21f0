"""The sglang backend's mapping between liveloop's values and SGLang's JSON: the /generate body, the
streamed chunks (cumulative, as SGLang streams by default, and incremental, with
--incremental-streaming-output, give the same deltas), finish reasons, weight-version labels, errors."""

from __future__ import annotations

import pytest

from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.engines.sglang_engine import SGLangError, chunk_delta, finish_reason, generate_body, weight_version

TRIPLES = [[-0.5, 11, None], [-1.25, 12, None], [-0.125, 4, None]]


def _chunk(n: int, triples, finish=None, version="3", **meta) -> dict:
    return {"text": "", "output_ids": [t[1] for t in triples],
            "meta_info": {"id": "r", "completion_tokens": n, "finish_reason": finish, "weight_version": version,
                          "output_token_logprobs": triples, **meta}}


def test_generate_body_names_sglangs_fields():
    request = GenerationRequest("r", (1, 2, 3), SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, seed=7,
                                                                top_logprobs=2, stop_token_ids=(4, 9)))
    body = generate_body(request, "r-1", adapter="cozy-3")
    assert body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.7, "top_p": 0.9, "ignore_eos": True, "stop_token_ids": [4, 9],
                            "sampling_seed": 7},
        "rid": "r-1", "return_logprob": True, "logprob_start_len": -1, "stream": True,
        "top_logprobs_num": 2, "lora_path": "cozy-3",
    }
    extended = generate_body(GenerationRequest("r", (1,), SamplingParams(max_tokens=1, top_k=3, min_p=0.1, repetition_penalty=1.2, min_tokens=2)), "r-3")
    assert {k: extended["sampling_params"][k] for k in ("top_k", "min_p", "repetition_penalty", "min_new_tokens")} == {
        "top_k": 3, "min_p": 0.1, "repetition_penalty": 1.2, "min_new_tokens": 2}
    plain = generate_body(GenerationRequest("r", (1,), SamplingParams(max_tokens=1)), "r-2")
    assert not {"top_logprobs_num", "lora_path"} & plain.keys()
    assert not {"sampling_seed", "stop_token_ids", "top_k", "min_p", "repetition_penalty", "min_new_tokens"} & plain["sampling_params"].keys()


def test_cumulative_and_incremental_chunks_give_the_same_deltas():
    cumulative = [_chunk(1, TRIPLES[:1]), _chunk(2, TRIPLES[:2], version="4"), _chunk(3, TRIPLES, {"type": "stop", "matched": 4}, "4")]
    incremental = [_chunk(1, TRIPLES[:1]), _chunk(2, TRIPLES[1:2], version="4"), _chunk(3, TRIPLES[2:], {"type": "stop", "matched": 4}, "4")]
    for chunks in (cumulative, incremental):
        sent, deltas = 0, []
        for c in chunks:
            delta, sent = chunk_delta(c, sent)
            deltas.append(delta)
        assert [(d.token_ids, d.logprobs, d.version, d.finish_reason) for d in deltas] == [
            ([11], [-0.5], 3, None), ([12], [-1.25], 4, None), ([4], [-0.125], 4, "stop")]


def test_the_prefix_caches_count_comes_with_the_first_tokens_only():
    first, later = _chunk(1, TRIPLES[:1]), _chunk(2, TRIPLES[:2])
    first["meta_info"]["cached_tokens"] = later["meta_info"]["cached_tokens"] = 48
    delta, sent = chunk_delta(first, 0)
    assert delta.cached_tokens == 48
    assert chunk_delta(later, sent)[0].cached_tokens is None
    assert chunk_delta(_chunk(1, TRIPLES[:1]), 0)[0].cached_tokens is None  # an SGLang that does not say


def test_a_chunk_with_nothing_new():
    assert chunk_delta(_chunk(2, TRIPLES[:2]), 2) == (None, 2)
    delta, sent = chunk_delta(_chunk(2, TRIPLES[:2], {"type": "abort", "message": "Aborted by AbortReq."}), 2)
    assert sent == 2 and (delta.token_ids, delta.finish_reason) == ([], "abort")


def test_top_logprobs_are_sorted_pairs():
    top = [[[-2.0, 7, None], [-0.1, 11, None]]]
    delta, _ = chunk_delta(_chunk(1, TRIPLES[:1], output_top_logprobs=top), 0)
    assert delta.top_logprobs == [[(11, -0.1), (7, -2.0)]]


@pytest.mark.parametrize("chunk", [
    {"error": {"message": "The input (600 tokens) is longer than the model's context length"}},
    {"text": "x"},  # no meta_info
    _chunk(3, TRIPLES[:1]),  # fewer logprobs than tokens: return_logprob was not honoured
])
def test_bad_chunks_are_sglang_errors(chunk):
    with pytest.raises(SGLangError, match="sglang /generate"):
        chunk_delta(chunk, 0)


def test_finish_reasons_and_labels():
    assert [finish_reason(r) for r in (None, {"type": "stop", "matched": 4}, {"type": "length", "length": 8},
                                       {"type": "abort", "message": "x"})] == [None, "stop", "length", "abort"]
    assert [weight_version(v) for v in ("7", 7, "default", None, True, "v2")] == [7, 7, None, None, None, None]


@pytest.mark.parametrize("bad", [{"sglang_url": "127.0.0.1:30000"}, {"sglang_timeout_seconds": 0}, {"sglang_health_seconds": -1}])
def test_config_refuses_bad_sglang_settings(bad):
    with pytest.raises(ValueError, match="sglang_"):
        EngineConfig(backend="sglang", **bad)


def test_an_sglang_server_that_does_not_answer_is_a_503_not_a_500():
    from liveloop.server.engines.sglang_engine import SGLangUnreachable
    from liveloop.server.edge.errors import domain_table

    answer = next(a for cls, a in domain_table() if isinstance(SGLangUnreachable("down"), cls))
    assert (answer.status, answer.code, answer.retry_after) == (503, "engine_unavailable", 5)
