"""One small metrics interface with slash names (`server/requests`, `server/swap_ms`) that feeds
Prometheus (`/metrics`) and can be read back as plain numbers (tests, logs).

`set_series` sets a labelled gauge family whole (series not given are removed): the fleet's
per-replica gauges (`fleet/replica_version{replica}`, ...), read from the replica registry at each
scrape, so a replica that left the fleet leaves no stale series behind."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def prom_name(name: str) -> str:
    return "liveloop_" + name.replace("/", "_").replace(".", "_").replace("-", "_")


class MetricClash(ValueError):
    """A metric name written as two kinds (a counter and a gauge) or with two sets of label names."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._metrics: dict[str, object] = {}
        self._labels: dict[str, tuple[str, ...]] = {}  # each metric's label names, as its first writer gave them
        self._lock = threading.Lock()

    def _get(self, kind: type, name: str, labels: dict[str, str], **kw: object):
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = kind(prom_name(name), name, labelnames=sorted(labels), registry=self.registry, **kw)
                self._metrics[name] = metric
                self._labels[name] = tuple(sorted(labels))
        if not isinstance(metric, kind):
            raise MetricClash(f"metric {name!r} is a {type(metric).__name__.lower()}, not a {kind.__name__.lower()}")
        if tuple(sorted(labels)) != self._labels.get(name, tuple(sorted(labels))):
            raise MetricClash(f"metric {name!r} has labels {self._labels[name]}, not {tuple(sorted(labels))}")
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._get(Counter, name, labels).inc(value)

    def set(self, name: str, value: float, **labels: str) -> None:
        self._get(Gauge, name, labels).set(value)

    def set_series(self, name: str, series: list[tuple[dict[str, str], float]]) -> None:
        """The gauge family `name` is exactly `series` ((labels, value) pairs, all with the same label
        names) now: series set before and not given are removed."""
        if not series and name not in self._metrics:
            return
        labels = series[0][0] if series else {}
        with self._lock:
            gauge = self._metrics.get(name)
            if gauge is None:
                gauge = Gauge(prom_name(name), name, labelnames=sorted(labels), registry=self.registry)
                self._metrics[name] = gauge
                self._labels[name] = tuple(sorted(labels))
            gauge.clear()
            for labelset, value in series:
                gauge.labels(**labelset).set(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._get(Histogram, name, labels, buckets=_LATENCY_BUCKETS).observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
