"""scripts/postgres.sh, run for real on a port and directory of each test's own (never the shared
cluster): its PostgreSQL refuses a connection without the password, takes the generated one (read from
the 0600 password file libpq is pointed at, never printed), keeps that file from other users, and
converts a cluster the old script initialised with `trust` in place, running or stopped."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from liveloop.devtools import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "postgres.sh"
NOBODY = 65534
BINS = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
pytestmark = [
    pytest.mark.skipif(not BINS, reason="no PostgreSQL installed (scripts/postgres.sh installs it)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the cluster as the postgres user and acts as nobody: needs root"),
]


class Cluster:
    def __init__(self):
        self.port = free_port()
        self.dir = Path(f"/tmp/liveloop-pgtest-{uuid.uuid4().hex[:10]}")
        self.secrets = Path(f"{self.dir}-auth")
        self.env = {**os.environ, "LIVELOOP_PG_PORT": str(self.port), "LIVELOOP_PG_DIR": str(self.dir)}
        self.env.pop("PGPASSWORD", None)
        self.env.pop("PGPASSFILE", None)

    def script(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done

    def connect(self, passfile: Path | str) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", passfile=str(passfile),
                               connect_timeout=10, autocommit=True)

    def old_trust(self, running: bool) -> None:
        """What the old scripts/postgres.sh made: `initdb -A trust`, started on 127.0.0.1."""
        bin_dir = BINS[-1].parent
        self.dir.mkdir(mode=0o700)
        os.chown(self.dir, *_postgres_ids())
        pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*pg, bin_dir / "initdb", "-D", self.dir, "-U", "postgres", "-A", "trust"], check=True, capture_output=True)
        subprocess.run([*pg, bin_dir / "pg_ctl", "-D", self.dir, "-l", self.dir / "server.log", "-w", "-t", "60",
                        "-o", f"-p {self.port} -k {self.dir} -h 127.0.0.1", "start"], check=True, capture_output=True)
        with self.connect("/nonexistent") as conn:  # open to anyone: no password asked
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        if not running:
            subprocess.run([*pg, bin_dir / "pg_ctl", "-D", self.dir, "-m", "fast", "stop"], check=True, capture_output=True)

    def close(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=self.env, capture_output=True, timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.secrets, ignore_errors=True)


def _postgres_ids() -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def assert_locked(c: Cluster, passfile: Path) -> None:
    """No password: refused. The generated one (from the password file): accepted."""
    with pytest.raises(psycopg.OperationalError, match="no password supplied|password authentication failed"):
        c.connect(c.dir / "no-such-passfile").close()
    with c.connect(passfile) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


def test_a_new_cluster_asks_for_the_generated_password(cluster, monkeypatch):
    done = cluster.script("start")
    url = done.stdout.strip()
    assert url == f"postgresql+psycopg://postgres@127.0.0.1:{cluster.port}/liveloop_test"
    assert_locked(cluster, cluster.secrets / "pgpass")
    assert Path(cluster.script("passfile").stdout.strip()) == cluster.secrets / "pgpass"
    passfile = cluster.secrets / "pgpass"
    password = (cluster.secrets / "password").read_text()
    assert len(password) >= 32
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres", password=password[:-1] + "!")
    # the password is nowhere but its files
    log = subprocess.run(["cat", str(cluster.dir / "server.log")], capture_output=True, text=True).stdout
    assert password not in done.stdout + done.stderr + url + log
    # the URL works for the tests as they use it (SQLAlchemy and psycopg, the password from PGPASSFILE)
    from sqlalchemy import create_engine, text

    with monkeypatch.context() as patch:  # the suite's own PGPASSFILE (the shared cluster's) comes back after
        patch.setenv("PGPASSFILE", str(passfile))
        engine = create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar() == "liveloop_test"
        engine.dispose()
    # a restart keeps the same password (and says nothing of it)
    again = cluster.script("start")
    assert (cluster.secrets / "password").read_text() == password and password not in again.stdout + again.stderr
    assert_locked(cluster, passfile)


def test_its_secrets_and_cluster_are_no_one_elses(cluster):
    cluster.script("start")
    assert mode(cluster.secrets) == 0o700 and mode(cluster.secrets / "password") == 0o600
    assert mode(cluster.secrets / "pgpass") == 0o600 and mode(cluster.dir) == 0o700
    assert os.lstat(cluster.secrets).st_uid == os.geteuid()
    for path in (cluster.secrets / "pgpass", cluster.secrets / "password", cluster.dir / "pg_hba.conf"):
        denied = subprocess.run(["cat", str(path)], user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, path
    # and the Unix socket (peer, in the 0700 cluster directory) admits only the cluster's own OS user
    assert subprocess.run(["runuser", "-u", "nobody", "--", "psql", "-X", "-w", "-h", str(cluster.dir), "-p", str(cluster.port),
                           "-U", "postgres", "-c", "SELECT 1", "postgres"], capture_output=True).returncode != 0


def test_a_planted_secrets_directory_is_refused(cluster):
    cluster.secrets.mkdir(mode=0o777)
    os.chown(cluster.secrets, NOBODY, NOBODY)  # another user got there first, to read the password later
    done = subprocess.run(["bash", str(SCRIPT), "start"], env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and f"{cluster.secrets} belongs to nobody" in done.stderr
    assert not (cluster.secrets / "password").exists()


@pytest.mark.parametrize("running", [True, False], ids=["running", "stopped"])
def test_an_old_trust_cluster_is_converted_in_place(cluster, running):
    cluster.old_trust(running)
    done = cluster.script("start")
    passfile = cluster.secrets / "pgpass"
    assert_locked(cluster, passfile)
    assert "accepted connections without a password" in done.stderr  # and the operator is told
    with cluster.connect(passfile) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (7,)  # the same cluster, its data kept
    hba = subprocess.run(["cat", str(cluster.dir / "pg_hba.conf")], capture_output=True, text=True).stdout
    assert "trust" not in hba
    password = (cluster.secrets / "password").read_text()
    log = subprocess.run(["cat", str(cluster.dir / "server.log")], capture_output=True, text=True).stdout
    assert password not in done.stdout + done.stderr + log
