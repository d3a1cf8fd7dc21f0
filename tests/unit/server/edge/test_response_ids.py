"""The ids the server gives responses, and the shape check a deletion's tombstone depends on."""

from __future__ import annotations

import pytest

from liveloop.server.edge.response_ids import issued, new_response_id


@pytest.mark.parametrize("prefix", ["chatcmpl", "cmpl", "msg", "resp"])
def test_every_issued_id_and_its_choices_have_the_shape(prefix):
    rid = new_response_id(prefix)
    assert issued(rid) and issued(f"{rid}-1") and issued(f"{rid}-127")
    assert rid != new_response_id(prefix)


@pytest.mark.parametrize("rid", [
    "r-1", "chatcmpl-", "chatcmpl-" + "g" * 32, "chatcmpl_" + "a" * 32, "msg-" + "a" * 32, "cmpl-" + "a" * 31,
    "cmpl-" + "a" * 33, "resp_" + "A" * 32, "cmpl-" + "a" * 32 + "-0", "cmpl-" + "a" * 32 + "-x", " cmpl-" + "a" * 32,
])
def test_anything_else_is_not_ours(rid):
    assert not issued(rid)
