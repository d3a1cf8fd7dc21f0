"""What the learner's integration tests share: a real SQLite store whose version 0 is the tiny model,
and rated responses with random tokens written into it through the store's own API."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig


@pytest.fixture
def store(tmp_path, model_dir):
    s = Store(StoreConfig(url=f"sqlite:///{tmp_path / 'l.db'}"))
    s.migrate()
    s.versions.ensure_base_version(str(model_dir))
    yield s
    s.close()


def rate_random(store: Store, n: int, start: int = 0) -> None:
    """Responses r{start}..r{start+n-1} (6 random prompt tokens, 8 response tokens at logprob -2 under
    version 0), rated alternately down and up by key "k"."""
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        rec = ResponseRecord(
            f"r{i}", "k", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)),
            tuple(int(x) for x in rng.integers(5, 500, 8)), (-2.0,) * 8, "stop", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", "k", i % 2))


@pytest.fixture
def rate() -> Callable[..., None]:
    """`rate(store, n, start=0)`: see `rate_random`."""
    return rate_random
