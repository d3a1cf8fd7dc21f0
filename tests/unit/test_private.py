"""liveloop/private.py: modes chosen whatever the umask, exclusive files, and the start-time check that
narrows (ours) or refuses (not ours to change) a data path other users can read."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from liveloop import private
from liveloop.config import load_config

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(autouse=True)
def open_umask():
    """The umask most shells have (022): the helpers must not depend on a private one."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_restrict_umask_is_077():
    private.restrict_umask()
    assert os.umask(0o022) == 0o077


def test_private_dir_makes_each_missing_directory_0700(tmp_path):
    made = private.private_dir(tmp_path / "a" / "b")
    assert made.is_dir() and mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700


def test_private_dir_leaves_an_existing_directory_for_the_check(tmp_path):
    (tmp_path / "d").mkdir(mode=0o755)
    private.private_dir(tmp_path / "d")
    assert mode(tmp_path / "d") == 0o755


def test_create_private_is_0600_and_never_through_a_symlink(tmp_path):
    os.close(private.create_private(tmp_path / "f"))
    assert mode(tmp_path / "f") == 0o600
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(FileExistsError):
        private.create_private(tmp_path / "link")
    assert victim.read_text() == "precious"


def test_private_temp_is_0600_exclusive_and_unpredictable(tmp_path):
    (fd1, a), (fd2, b) = private.private_temp(tmp_path / "out.jsonl"), private.private_temp(tmp_path / "out.jsonl")
    os.close(fd1), os.close(fd2)
    assert a != b and a.parent == b.parent == tmp_path
    assert str(os.getpid()) not in a.name  # the old name was .out.jsonl.<pid>.partial
    assert mode(a) == mode(b) == 0o600


def test_check_narrows_what_is_ours_and_says_so_loudly(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    store = data / "liveloop.db"
    store.write_text("")
    os.chmod(store, 0o644)
    with caplog.at_level(logging.WARNING, logger="liveloop.private"):
        narrowed = private.check_private([data, store, tmp_path / "missing"])
    assert narrowed == [data, store]
    assert mode(data) == 0o700 and mode(store) == 0o600
    assert f"{data} had mode 0755" in caplog.text and "PRIVATE DATA WAS EXPOSED" in caplog.text
    assert private.check_private([data, store]) == []  # private now: nothing more to say


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_check_refuses_another_users_directory(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chown(data, NOBODY, NOBODY)
    with pytest.raises(private.NotPrivate, match=rf"{data} \(mode 0755, owner uid {NOBODY}\).*chmod 700 {data}"):
        private.check_private([data])
    assert mode(data) == 0o755  # not ours: left as it is


def test_check_refuses_a_shared_sticky_directory(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(private.NotPrivate, match="every user can write"):
        private.check_private([shared])
    assert mode(shared) == 0o1777  # never chmod a /tmp


def test_check_data_reads_the_store_and_checkpoint_directories_from_the_config(tmp_path):
    data, versions, checkpoints = tmp_path / "data", tmp_path / "versions", tmp_path / "checkpoints"
    for d in (data, versions, checkpoints):
        d.mkdir(mode=0o755)
    (data / "store.db-wal").write_text("")
    os.chmod(data / "store.db-wal", 0o644)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{data}/store.db"\n[learner]\ncheckpoint_dir = "{versions}"\n'
                   f'[engine]\ncheckpoint_dir = "{checkpoints}"\n')
    narrowed = private.check_data(load_config(cfg))
    assert set(narrowed) == {data, data / "store.db-wal", versions, checkpoints}
    assert mode(data) == mode(versions) == mode(checkpoints) == 0o700 and mode(data / "store.db-wal") == 0o600


def test_check_data_has_nothing_to_say_about_postgresql(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "postgresql+psycopg://u@127.0.0.1:1/x"\n[learner]\ncheckpoint_dir = "{tmp_path}/v"\n'
                   f'[engine]\ncheckpoint_dir = "{tmp_path}/c"\n')
    assert private.data_paths(load_config(cfg)) == [tmp_path / "v", tmp_path / "c"]
