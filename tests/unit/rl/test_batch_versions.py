"""Per-token versions in the learner's batch: a response a `keep` swap continued under new weights
carries its version spans into `TokenBatch.versions` [B, W], token by token; one without spans is
all its policy version; behaviour logprobs stay exactly as recorded."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest

from liveloop.rl.batch import Sample, make_batch, token_versions
from liveloop.rl.losses import staleness_metrics
from liveloop.store.records import StoredFeedback, StoredResponse


def _sample(n: int, version: int, spans=None, logprobs=None) -> Sample:
    lps = np.asarray(logprobs if logprobs is not None else -np.arange(1, n + 1) / 10, np.float32)
    return Sample(np.array([1, 2]), np.arange(10, 10 + n), lps, np.ones(n, np.uint8), 1.0, version, "k", spans)


def test_token_versions_from_spans():
    assert token_versions(5, 3, None).tolist() == [3, 3, 3, 3, 3]
    assert token_versions(5, 3, ((0, 2, 3), (2, 4, 4), (4, 5, 6))).tolist() == [3, 3, 4, 4, 6]
    assert token_versions(0, 3, None).tolist() == []
    with pytest.raises(ValueError):
        token_versions(3, 1, ((0, 4, 1),))  # a span past the response's end is a corrupt record


def test_batch_versions_per_token_with_padding():
    mixed = _sample(5, 2, ((0, 2, 2), (2, 5, 3)))
    plain = _sample(3, 1)
    batch = make_batch([mixed, plain])
    assert batch.versions.shape == batch.response_ids.shape == (2, 5)
    # past a response's end: its last token's version (the action mask drops those positions)
    assert batch.versions.tolist() == [[2, 2, 3, 3, 3], [1, 1, 1, 1, 1]]
    assert batch.action_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # the behaviour logprobs are those recorded, whatever version sampled them
    assert batch.behavior_logprobs[0].tolist() == pytest.approx(mixed.behavior_logprobs.tolist())
    # the learner's staleness (learner/online.py: learner version - batch.versions), per token
    staleness = (4 - batch.versions).clamp(min=0)
    assert staleness.tolist() == [[2, 2, 1, 1, 1], [3, 3, 3, 3, 3]]
    m = staleness_metrics(staleness, batch.action_mask)
    # over the 8 action tokens only: (2 + 2 + 1 + 1 + 1 + 3 + 3 + 3) / 8; padding does not count
    assert m["learner/staleness_mean"] == pytest.approx(16 / 8)
    assert m["learner/staleness_max"] == 3.0


def test_sample_from_a_stored_response_keeps_its_spans():
    now = datetime.now(timezone.utc)
    response = StoredResponse(
        id="r1", api_key_id="k", model="m", policy_version=4, endpoint="chat", prompt_ids=np.array([1, 2]),
        response_ids=np.array([5, 6, 7]), behavior_logprobs=np.array([-0.1, -0.2, -0.3], np.float32),
        action_mask=np.ones(3, np.uint8), finish_reason="stop", temperature=1.0, top_p=1.0, seed=None,
        latency_ms=1.0, ttft_ms=None, request_meta=None, created_at=now, version_spans=((0, 1, 4), (1, 3, 5)),
    )
    feedback = StoredFeedback(1, "r1", "k", 1, None, now)
    sample = Sample.from_rated(feedback, response)
    assert sample.version_spans == ((0, 1, 4), (1, 3, 5))
    assert sample.token_versions().tolist() == [4, 5, 5]
    plain = Sample.from_rated(feedback, StoredResponse(**{**response.__dict__, "version_spans": None}))
    assert plain.token_versions().tolist() == [4, 4, 4]
    assert make_batch([sample, plain]).versions.tolist() == [[4, 5, 5], [4, 4, 4]]
