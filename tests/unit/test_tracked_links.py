"""No tracked symbolic link points outside the repository: a link committed from one machine (to its own
checkout, its models or its artifacts) is a broken path, or a loop, on every fresh clone. A fresh clone's
browser tests once failed writing screenshots through such a link at tests/artifacts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def outside_links(root: Path) -> dict[str, str]:
    """path -> target of each symbolic link git tracks in `root` (mode 120000) that points outside it."""
    listed = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=root, capture_output=True, check=True).stdout.decode()
    found = {}
    for entry in filter(None, listed.split("\0")):
        mode, _, rest = entry.partition(" ")
        path = rest.split("\t", 1)[1]
        if mode != "120000" or not (root / path).is_symlink():
            continue
        target = os.readlink(root / path)
        if os.path.isabs(target) or not (root / path).parent.joinpath(target).resolve().is_relative_to(root.resolve()):
            found[path] = target
    return found


def test_no_tracked_link_leaves_the_repository():
    assert outside_links(ROOT) == {}


def test_the_check_sees_links_that_leave(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("a")
    (tmp_path / "absolute").symlink_to("/work/main/tests/artifacts")
    (tmp_path / "climbs").symlink_to("../elsewhere")
    (tmp_path / "inside").symlink_to("docs/a.md")
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    assert outside_links(tmp_path) == {"absolute": "/work/main/tests/artifacts", "climbs": "../elsewhere"}
