"""`store.release.served_replies` (what the learning view reads), on real SQLite and PostgreSQL: one segment's
newest responses first (None: those recorded without a segment), at most `limit`, each with its reply
tokens and its ratings in arrival order, quarantined keys' ratings left out."""

from datetime import datetime, timedelta, timezone

from liveloop.store import FeedbackRecord, ResponseRecord

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _response(i: int, segment: str | None, key: str = "k1") -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}", api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=(1, 2),
        response_ids=(10 + i, 20 + i), behavior_logprobs=(-0.5, -0.25), finish_reason="stop", temperature=1.0, top_p=1.0,
        latency_ms=1.0, created_at=T0 + timedelta(seconds=i), segment=segment,
    )


def test_newest_first_per_segment_with_trusted_ratings(store):
    # cozy: 1, 3, 5 (5 by key k2); none: 0, 2, 4
    store.feedback.insert_responses([_response(i, "cozy" if i % 2 else None, "k2" if i == 5 else "k1") for i in range(6)])
    store.feedback.put_feedback(FeedbackRecord("r-3", "k1", 1))
    store.feedback.put_feedback(FeedbackRecord("r-5", "k2", 0))
    store.feedback.put_feedback(FeedbackRecord("r-4", "k1", 1))
    cozy = store.release.served_replies("cozy", 10)
    assert [r.response_id for r in cozy] == ["r-5", "r-3", "r-1"]
    assert cozy[0].response_ids == (15, 25) and cozy[0].policy_version == 0
    assert [[reward for _, reward in r.ratings] for r in cozy] == [[0], [1], []]
    assert cozy[0].ratings[0][0] > cozy[1].ratings[0][0]  # feedback ids: arrival order
    assert [r.response_id for r in store.release.served_replies(None, 2)] == ["r-4", "r-2"]
    assert store.release.served_replies("night", 10) == []

    store.keys.set_quarantined("k2", True)
    assert [[reward for _, reward in r.ratings] for r in store.release.served_replies("cozy", 10)] == [[], [1], []]
    assert [[reward for _, reward in r.ratings] for r in store.release.served_replies("cozy", 10, trusted=False)] == [[0], [1], []]
