"""Past the eight guessable names (liveloop/transport/private_dir.py): the names derived from the
namespace are the same for every process of a deployment, differ between deployments and users' guesses,
and a namespace directory is refused (TransportUnavailable) only once all of them are taken too. Under a
base directory of the test's own; planting another user's directory needs root (chown)."""

from __future__ import annotations

import os
import re

import pytest

from liveloop.transport import TransportUnavailable, private_dir

OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="planting another user's directory needs root (chown)")


def test_the_unguessable_names_follow_the_guessable_ones_and_the_namespace(tmp_path):
    names = [p.name for p in private_dir.candidates(tmp_path, "dabc")]
    assert names[:8] == [f"liveloop-{os.getuid()}"] + [f"liveloop-{os.getuid()}-{k}" for k in range(1, 8)]
    assert len(names) == 24 and all(re.fullmatch(rf"liveloop-{os.getuid()}-[0-9a-f]{{32}}", n) for n in names[8:])
    assert names == [p.name for p in private_dir.candidates(tmp_path, "dabc")]  # every process walks the same list
    assert set(names[8:]).isdisjoint(p.name for p in private_dir.candidates(tmp_path, "dabd"))
    assert [p.name for p in private_dir.candidates(tmp_path)] == names[:8]


@needs_root
def test_eight_taken_names_move_a_namespace_to_its_first_unguessable_one(tmp_path):
    for path in private_dir.candidates(tmp_path)[:8]:
        path.mkdir()
        os.chown(path, OTHER_UID, OTHER_UID)
    folder = private_dir.namespace_dir("dabc", base=tmp_path)
    assert folder.parent == private_dir.candidates(tmp_path, "dabc")[8] and os.lstat(folder.parent).st_uid == os.getuid()
    assert private_dir.namespace_dir("dabc", base=tmp_path) == folder


@needs_root
def test_every_name_taken_refuses_the_namespace(tmp_path):
    for path in private_dir.candidates(tmp_path, "dabc"):
        path.mkdir()
        os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(TransportUnavailable, match="taken by another user"):
        private_dir.namespace_dir("dabc", base=tmp_path)
