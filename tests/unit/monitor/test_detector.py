"""Change detectors: hand-computed traces, then seeded synthetic streams (bounded delay on a real
shift, the documented false-alarm rate on stationary streams)."""

import random
import statistics

import pytest

from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.detector import Cusum, PageHinkley, make_detector


def test_cusum_by_hand():
    # warm-up 1, 0 -> mu0 = 0.5; then each 0 adds 0.5 - 0 - 0.1 = 0.4 to S-: 0.4, 0.8, 1.2 > 1.0
    d = Cusum(delta=0.1, threshold=1.0, warmup=2)
    assert [d.update(x) for x in (1, 0, 0, 0)] == [None] * 4
    assert d.state()["down"] == pytest.approx(0.8)
    alarm = d.update(0)
    assert (alarm.index, alarm.direction, alarm.before, alarm.after) == (5, "down", 0.5, 0.0)
    assert d.state()["since_restart"] == 0 and d.state()["warming_up"]


def test_page_hinkley_by_hand():
    # delta 0: m_down += mean_t - x: 0, 0.5, 0.5 + 1/3, + 1/4 = 1.0833 > 0.9 at the 4th rating
    d = PageHinkley(delta=0.0, threshold=0.9, warmup=1)
    assert [d.update(x) for x in (1, 0, 0)] == [None] * 3
    assert d.state()["down"] == pytest.approx(0.5 + 1 / 3)
    alarm = d.update(0)
    assert (alarm.index, alarm.direction) == (4, "down")
    assert alarm.before == pytest.approx(0.25)


def test_no_alarm_during_warmup():
    d = PageHinkley(delta=0.0, threshold=0.5, warmup=10)
    assert all(d.update(x) is None for x in [1] * 5 + [0] * 4)
    assert d.update(0) is not None


def _stream(rng: random.Random, rates: list[tuple[float, int]]) -> list[float]:
    return [1.0 if rng.random() < p else 0.0 for p, n in rates for _ in range(n)]


def _alarms(config: MonitorConfig, xs: list[float]) -> list[int]:
    d = make_detector(config)
    return [a.index for x in xs if (a := d.update(x))]


CONFIGS = {
    "page-hinkley": MonitorConfig(),  # the defaults: delta 0.05, threshold 25, warm-up 50
    "cusum": MonitorConfig(detector="cusum", delta=0.05, threshold=25.0, warmup=200),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_detects_a_real_shift_within_a_bounded_delay(name):
    delays = []
    for seed in range(30):
        rng = random.Random(seed)
        fall = _alarms(CONFIGS[name], _stream(rng, [(0.8, 600), (0.4, 600)]))
        rise = _alarms(CONFIGS[name], _stream(rng, [(0.3, 600), (0.7, 600)]))
        for alarms in (fall, rise):
            after = [i - 600 for i in alarms if i > 600]
            assert after, f"seed {seed}: the shift at 600 was never detected"
            delays.append(after[0])
    assert statistics.median(delays) <= 120
    assert max(delays) <= 250


@pytest.mark.parametrize("name", CONFIGS)
def test_false_alarm_rate_on_stationary_streams(name):
    # documented in bench/drift_detector.py's output: well under one false alarm per 1,000 ratings
    alarms = events = 0
    for seed in range(20):
        for p in (0.2, 0.5, 0.8):
            xs = _stream(random.Random(100 + seed), [(p, 3000)])
            alarms += len(_alarms(CONFIGS[name], xs))
            events += len(xs)
    assert alarms / events * 1000 <= 0.2


def test_config_rejects_unknown_detector():
    with pytest.raises(ValueError, match="detector"):
        MonitorConfig(detector="adwin")
