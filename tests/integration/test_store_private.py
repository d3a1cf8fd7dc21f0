"""Another local account against what liveloop keeps at rest, on a real SQLite store, a real export and
the real `liveloop` command: the attacker is `nobody` (a subprocess with its uid, gid and no other
groups), reading through a directory every user may enter, as a home or a checkout usually is. Each
test first shows the attacker can read an ordinary 0644 file there, so a refusal is the modes' doing."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from liveloop.store import Store, StoreConfig
from liveloop.store.export import export

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True, timeout=60)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def home():
    """A 0755 directory under /tmp (pytest's own are 0700: nobody could not even look), the umask 022."""
    before = os.umask(0o022)
    path = Path(tempfile.mkdtemp(prefix="liveloop-home-"))
    os.chmod(path, 0o755)
    (path / "notes.txt").write_text("anyone may read this")
    assert as_nobody("cat", str(path / "notes.txt")).returncode == 0  # the attacker can read what is not private
    yield path
    os.umask(before)
    shutil.rmtree(path)


@pytest.fixture
def store(home):
    s = Store(StoreConfig(url=f"sqlite:///{home / 'data' / 'liveloop.db'}"))
    s.migrate()
    s.versions.ensure_base_version("/models/base")  # a write: the -wal and -shm files are there while it is open
    yield s
    s.close()


def test_another_user_cannot_read_the_store_its_wal_or_its_directory(home, store):
    data = home / "data"
    db, wal, shm = data / "liveloop.db", data / "liveloop.db-wal", data / "liveloop.db-shm"
    assert wal.exists() and shm.exists()
    assert mode(data) == 0o700 and mode(db) == mode(wal) == mode(shm) == 0o600
    assert as_nobody("ls", str(data)).returncode != 0
    os.chmod(data, 0o755)  # even with its directory opened up, the files themselves stay closed
    for path in (db, wal, shm):
        denied = as_nobody("cat", str(path))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, path


def test_an_existing_world_readable_store_is_narrowed_when_opened(home):
    db = home / "old.db"
    sqlite3.connect(db).close()
    os.chmod(db, 0o644)  # what an older liveloop left under umask 022
    assert as_nobody("cat", str(db)).returncode == 0
    s = Store(StoreConfig(url=f"sqlite:///{db}"))
    try:
        s.migrate()
        assert mode(db) == 0o600 and mode(home / "old.db-wal") == 0o600
        assert as_nobody("cat", str(db)).returncode != 0
    finally:
        s.close()


def test_another_user_cannot_read_an_export(home, store):
    out = home / "ratings.jsonl"
    export(store, out, "jsonl", "raw")
    assert out.is_file() and mode(out) == 0o600
    assert as_nobody("cat", str(out)).returncode != 0


def test_a_planted_link_at_the_temporary_name_redirects_nothing(home, store):
    victim = home / "victim.txt"
    victim.write_text("precious")
    out = home / "ratings.jsonl"
    # the name the export used to write through: .<name>.<pid>.partial, opened without O_EXCL
    (home / f".{out.name}.{os.getpid()}.partial").symlink_to(victim)
    export(store, out, "jsonl", "raw")
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and out.is_file() and mode(out) == 0o600


def test_the_cli_export_is_private_whatever_the_umask(home, store):
    out = home / "cli.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "liveloop.cli", "store", "export", "--url", str(store.engine.url), "--shape", "raw",
         "--format", "jsonl", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=home,  # the umask this test runs under: 022
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["path"] == str(out)
    assert mode(out) == 0o600 and as_nobody("cat", str(out)).returncode != 0


def test_serve_refuses_a_data_directory_others_can_read_that_is_not_its_own(home):
    data = home / "shared"
    data.mkdir(mode=0o755)
    os.chown(data, NOBODY, NOBODY)  # another account's directory, open to all
    cfg = home / "serve.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{data}/liveloop.db"\n[learner]\nenabled = false\ncheckpoint_dir = "{home}/v"\n')
    done = subprocess.run([sys.executable, "-m", "liveloop.cli", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300, cwd=home)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{data} (mode 0755, owner uid {NOBODY})" in done.stderr and f"chmod 700 {data}" in done.stderr
    assert not (data / "liveloop.db").exists()  # refused before the store was opened


def test_serve_narrows_its_own_world_readable_data_directory_with_a_warning(home):
    """The check runs before the model: with a model directory that is not one, serve stops right after
    it (exit 2), and what it narrowed stays narrowed."""
    data = home / "data"
    data.mkdir(mode=0o755)
    cfg = home / "serve.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{data}/liveloop.db"\n[engine]\nmodel = "{home}/no-model"\n'
                   f'checkpoint_dir = "{home}/c"\n[learner]\nenabled = false\ncheckpoint_dir = "{home}/v"\n')
    done = subprocess.run([sys.executable, "-m", "liveloop.cli", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300, cwd=home)
    assert f"PRIVATE DATA WAS EXPOSED: {data} had mode 0755" in done.stderr, done.stderr[-2000:]
    assert mode(data) == 0o700 and as_nobody("ls", str(data)).returncode != 0


def test_ray_workers_inherit_the_private_umask(tmp_path):
    """`serve --config ray` starts Ray from the CLI's process, after its umask 077: a Ray task (a worker
    process the raylet started) creates files 0600 and reports the umask it runs under."""
    script = tmp_path / "ray_umask.py"
    script.write_text(
        "import os, sys\n"
        "from liveloop.private import restrict_umask\n"
        "restrict_umask()\n"
        "import ray\n"
        "from liveloop.learner.actor import start_private_ray\n"
        "start_private_ray(num_cpus=1)\n"
        "@ray.remote\n"
        "def probe(path):\n"
        "    mask = os.umask(0); os.umask(mask)\n"
        "    open(path, 'w').close()\n"
        "    return mask\n"
        f"print('UMASK', oct(ray.get(probe.remote({str(tmp_path / 'made')!r}))))\n"
        "ray.shutdown()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "UMASK 0o77" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert mode(tmp_path / "made") == 0o600
