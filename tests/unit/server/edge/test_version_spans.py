"""Version spans from engine deltas (`serving.version_spans`, `serving.VersionSpans`): which version
sampled which response tokens, as a `keep` swap leaves them."""

from liveloop.server.engines.base import TokenDelta
from liveloop.server.edge.pipeline.serving import VersionSpans, version_spans


def _delta(n: int, version: int | None = None, finish: str | None = None) -> TokenDelta:
    return TokenDelta(list(range(n)), [0.0] * n, None, finish, version)


def test_no_swap_is_one_span_of_the_admitted_version_and_no_record():
    deltas = [_delta(1), _delta(3), _delta(2, finish="length")]
    assert version_spans(deltas, 4) == ((0, 6, 4),)
    spans = VersionSpans(4)
    for d in deltas:
        spans.add(len(d.token_ids), d.version)
    assert spans.record() is None  # the store keeps today's rows: all of it by policy_version


def test_explicit_admitted_version_is_the_same_as_none():
    deltas = [_delta(2), _delta(2, version=4), _delta(1)]
    assert version_spans(deltas, 4) == ((0, 5, 4),)


def test_a_keep_swap_mid_response_splits_at_the_token_boundary():
    # tokens 0-2 by v1, then the swap: 3-6 by v2, then another: 7 by v3
    deltas = [_delta(1), _delta(2, 1), _delta(1, 2), _delta(3, 2), _delta(1, 3, finish="stop")]
    assert version_spans(deltas, 1) == ((0, 3, 1), (3, 7, 2), (7, 8, 3))
    spans = VersionSpans(1)
    assert [spans.add(len(d.token_ids), d.version) for d in deltas] == [1, 1, 2, 2, 3]
    assert spans.record() == ((0, 3, 1), (3, 7, 2), (7, 8, 3))


def test_empty_deltas_add_nothing():
    # an abort after a swap, or a finish delta without tokens, is no span
    deltas = [_delta(2), _delta(0, 5), _delta(2, 5), _delta(0, 6, finish="abort")]
    assert version_spans(deltas, 3) == ((0, 2, 3), (2, 4, 5))
    assert version_spans([_delta(0, finish="abort")], 3) == ()
    assert VersionSpans(3).record() is None


def test_swapped_before_the_first_token_is_recorded():
    # admitted at v2, but the swap came before any token: the whole response is v3's
    spans = VersionSpans(2)
    spans.add(4, 3)
    assert spans.all() == ((0, 4, 3),) and spans.record() == ((0, 4, 3),)
