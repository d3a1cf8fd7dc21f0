"""Another local account that takes the shared-memory names first cannot stop a deployment: a real
`liveloop serve` (the shared_memory fast path, its co-located learner) starts after the attacker (uid
65534, `nobody`) has planted directories under every name it can know in /dev/shm.

- The eight guessable names (`liveloop-<uid>`, `-1`..`-7`) taken: the server starts, keeps its weights
  under a name derived from the store's random deployment id (0700, its own), and swaps a learner's
  version in from shared memory.
- Every name taken (the attacker also knows the unguessable ones, as one who read the store would):
  the server starts all the same, records a `transport_fallback` event, and the learner's version
  travels through a checkpoint directory instead.

The server runs in a mount namespace of its own with a fresh tmpfs on /dev/shm (`unshare -m`), so the
names planted for root are not the ones other servers on this machine use; the test plants and looks
through /proc/<pid>/root/dev/shm. Planting for another user needs root (os.chown)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import USER_KEY, free_port, wait_healthy, wait_until, write_config
from liveloop.store import Store, StoreConfig, VersionStatus
from liveloop.transport import private_dir

from .conftest import FAST_LEARNER, MOON, SHM_TRANSPORT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace and planting for another user need root")]
NOBODY = 65534
UID = os.getuid()


@pytest.fixture
def shm() -> Iterator[tuple[int, Path]]:
    """A mount namespace whose /dev/shm is a fresh tmpfs: (the pid holding it, that /dev/shm seen from here)."""
    holder = subprocess.Popen(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o mode=1777 liveloop-test /dev/shm && exec sleep 3600"])
    path = Path(f"/proc/{holder.pid}/root/dev/shm")
    deadline = time.monotonic() + 60  # a hang guard: a loaded machine mounts slower, it does not skip
    while holder.poll() is None and time.monotonic() < deadline and os.stat(path).st_dev == os.stat("/dev/shm").st_dev:
        time.sleep(0.05)
    if holder.poll() is not None or os.stat(path).st_dev == os.stat("/dev/shm").st_dev:
        holder.kill()
        pytest.skip("no private mount namespace here (unshare -m)")
    try:
        yield holder.pid, path
    finally:
        holder.kill()
        holder.wait(10)


def names_of(base: Path, namespace: str | None) -> list[Path]:
    """What the attacker plants: the eight guessable names; given the namespace, every other candidate too."""
    guessable = [base / (f"liveloop-{UID}" if k == 0 else f"liveloop-{UID}-{k}") for k in range(8)]
    return private_dir.candidates(base, namespace) if namespace is not None else guessable


def plant(paths: list[Path]) -> None:
    for path in paths:
        path.mkdir(mode=0o777)
        os.chmod(path, 0o777)
        os.chown(path, NOBODY, NOBODY)


@pytest.fixture
def workdir(tmp_path, model_dir) -> Path:
    return tmp_path / "srv"


def serve(holder: int, workdir: Path, model_dir: Path) -> tuple[subprocess.Popen, str, str]:
    """`liveloop serve` in `holder`'s mount namespace, in its own process group, once /healthz answers:
    (process, base URL, store URL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config, store_url = write_config(workdir, Path(model_dir).resolve(), "hf", port, learner=FAST_LEARNER, extends="tuned_learner", extra=SHM_TRANSPORT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", sys.executable, "-m", "liveloop.cli", "--config", str(config), "serve"],
        stdout=(workdir / "server.log").open("w"), stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base_url + "/healthz", 240)
    except RuntimeError as exc:
        stop(proc)
        pytest.fail(f"server {exc}:\n{log(workdir)}")
    return proc, base_url, store_url


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(10)


def log(workdir: Path) -> str:
    return "\n".join((workdir / "server.log").read_text(errors="replace").splitlines()[-80:])


def rate_until_serving(base_url: str, store: Store) -> int:
    """Rate replies until a learner's version serves; that version."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60, trust_env=False) as c:
        for i in range(3):
            rid = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MOON, "max_tokens": 8}).json()["id"]
            assert c.post("/v1/feedback", json={"response_id": rid, "reward": i % 2}).status_code == 200
    record = wait_until(lambda: store.versions.latest_version(VersionStatus.SERVING) if _learned(store) else None, 180, "a learner's version to serve")
    return record.version


def _learned(store: Store) -> bool:
    record = store.versions.latest_version(VersionStatus.SERVING)
    return record is not None and record.version > 0


def migrated_namespace(store_url: str) -> str:
    """The deployment's namespace, from its store (what an attacker who could read the store would know)."""
    store = Store(StoreConfig(url=store_url))
    try:
        store.migrate()
        return f"d{store.fleet.deployment_id()[:15]}"
    finally:
        store.close()


def ours(base: Path) -> list[Path]:
    return [p for p in base.iterdir() if p.name.startswith(f"liveloop-{UID}") and os.lstat(p).st_uid == UID]


def test_eight_planted_names_move_shared_memory_to_an_unguessable_one(shm, workdir, model_dir):
    holder, base = shm
    plant(names_of(base, None))
    proc, base_url, store_url = serve(holder, workdir, model_dir)
    store = Store(StoreConfig(url=store_url))
    try:
        version = rate_until_serving(base_url, store)
        assert "from shared_memory" in log(workdir), log(workdir)
        namespace = f"d{store.fleet.deployment_id()[:15]}"
        assert ours(base) == [private_dir.candidates(base, namespace)[8]]  # the first unguessable name, the deployment's own
        assert stat.S_IMODE(os.lstat(ours(base)[0]).st_mode) == 0o700
        assert store.versions.get_version(version).weights_nonce  # published in memory, not through a checkpoint
        assert not [e for e in store.operator.events() if e.kind in ("transport_fallback", "weights_rejected")]
        assert all(os.lstat(p).st_uid == NOBODY for p in names_of(base, None))  # theirs, left alone
    finally:
        stop(proc)
        store.close()
    assert "Traceback" not in log(workdir)


def test_every_name_planted_falls_back_to_checkpoints_and_still_publishes(shm, workdir, model_dir):
    holder, base = shm
    workdir.mkdir(parents=True)
    _, store_url = write_config(workdir, Path(model_dir).resolve(), "hf", 0)
    plant(names_of(base, migrated_namespace(store_url)))  # the store is made before the server starts: its id is known
    proc, base_url, store_url = serve(holder, workdir, model_dir)
    store = Store(StoreConfig(url=store_url))
    try:
        (event,) = [e for e in store.operator.events() if e.kind == "transport_fallback"]
        assert event.detail["configured"] == "shared_memory" and event.detail["used"] == "checkpoint_dir"
        assert "taken by another user" in event.detail["reason"]
        version = rate_until_serving(base_url, store)
        record = store.versions.get_version(version)
        assert record.checkpoint_sha256 and not record.weights_nonce  # through its checkpoint directory
        assert ours(base) == []
    finally:
        stop(proc)
        store.close()
    assert "Traceback" not in log(workdir)
