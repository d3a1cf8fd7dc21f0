"""liveloop.home: where a config's model path points, inside a checkout and outside one."""

from __future__ import annotations

from pathlib import Path

from liveloop.home import HOME_ENV, in_checkout, liveloop_home, model_path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = "models/liveloop-tiny"


def test_in_a_checkout_the_default_stays_relative(monkeypatch):
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    assert in_checkout()
    assert model_path(DEFAULT) == Path(DEFAULT)  # scripts, tests and CI keep models/liveloop-tiny


def test_outside_a_checkout_the_default_goes_to_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert not in_checkout()
    assert liveloop_home() == tmp_path / "cache" / "liveloop"
    assert model_path(DEFAULT) == tmp_path / "cache" / "liveloop" / DEFAULT
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert liveloop_home() == Path.home() / ".cache" / "liveloop"


def test_a_model_already_in_the_working_directory_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT).mkdir(parents=True)
    assert model_path(DEFAULT) == Path(DEFAULT)


def test_liveloop_home_wins_for_relative_paths_and_absolute_paths_stay(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)  # also inside a checkout
    assert model_path(DEFAULT) == tmp_path / "home" / DEFAULT
    assert model_path(tmp_path / "m") == tmp_path / "m"
    assert model_path("~/m") == Path.home() / "m"


def test_the_bgpo_job_reads_its_model_paths_the_same_way(tmp_path, monkeypatch):
    from liveloop.diffusion.cli import with_model_paths
    from liveloop.diffusion.config import load_bgpo_config

    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    job = load_bgpo_config("bgpo")
    monkeypatch.chdir(ROOT)
    assert with_model_paths(job) == job  # in the checkout: as written
    monkeypatch.chdir(tmp_path)
    moved = with_model_paths(job)
    cached = str(tmp_path / "cache" / "liveloop" / "models" / "liveloop-diffusion-tiny")
    assert moved.bgpo.model_dir == moved.build.out_dir == cached  # built where the job then loads it
    assert moved.bgpo.out_dir == job.bgpo.out_dir  # the job's own data stays in the working directory
