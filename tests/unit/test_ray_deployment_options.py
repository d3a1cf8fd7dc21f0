"""The replicas' Serve deployment options (liveloop/serve_ray.py `deployment_options`): the proxy's queue
is bounded by `[ray] max_queued_requests` (0: `[server] max_concurrent_total`), past it a 503 with
`[server] retry_after_seconds`; Serve takes them as the deployment's config (no Ray started here: the
bound's effect is tests/e2e/test_ray_backpressure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from liveloop.config import load_config
from liveloop.ray_config import RayConfig
from liveloop.serve_ray import _replica_class, deployment_options

PRESET = Path(__file__).resolve().parents[2] / "configs/serve/ray.toml"


def test_the_preset_bounds_the_proxy_queue():
    config = load_config(PRESET)
    options = deployment_options(config)
    assert options["max_queued_requests"] == options["max_ongoing_requests"] == config.server.max_concurrent_total
    from ray import serve

    deployed = serve.deployment(_replica_class()).options(**options)._deployment_config
    assert deployed.max_queued_requests == config.server.max_concurrent_total > 0
    assert (deployed.backpressure_config.status_code, deployed.backpressure_config.retry_after_s) == (503, config.server.retry_after_seconds)


def test_a_set_bound_is_the_deployments_and_unbounded_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'extends = "{PRESET}"\n[ray]\nmax_queued_requests = 7\n')
    assert deployment_options(load_config(path))["max_queued_requests"] == 7
    with pytest.raises(ValueError, match="max_queued_requests"):
        RayConfig(max_queued_requests=-1)  # Serve's "no limit"
