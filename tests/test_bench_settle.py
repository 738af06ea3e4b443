"""When bench.bench_scale_idle starts its measured window (bench.bench_scale_idle.flat): once every process's CPU,
sampled in windows, has been flat for the last N windows, whatever its level."""

from __future__ import annotations

import pytest

from bench.bench_scale_idle import SettleRule, flat


@pytest.mark.parametrize("history, windows, tolerance, expected", [
    ({"broker 0": [0.30, 0.20, 0.005, 0.006, 0.005]}, 3, 0.01, True),  # start-up work over 3 windows ago
    ({"broker 0": [0.30, 0.20, 0.005, 0.006, 0.005]}, 4, 0.01, False),  # ... but not 4
    ({"broker 0": [0.005, 0.006], "PostgreSQL": [0.002, 0.002]}, 3, 0.01, False),  # too few windows yet
    ({"broker 0": [0.005, 0.006, 0.005], "broker 1": [0.2, 0.1, 0.006]}, 3, 0.01, False),  # one still busy
    ({"broker 0": [0.005, 0.006, 0.005], "broker 1": [0.006, 0.004, 0.006]}, 3, 0.01, True),
    ({"broker 0": [0.40, 0.40, 0.401]}, 3, 0.01, True),  # flat, however high: the table shows the level
    ({"broker 0": [0.005, 0.016, 0.005]}, 3, 0.01, False),  # a spike inside the last windows
])
def test_flat(history, windows, tolerance, expected):
    assert flat(history, windows, tolerance) is expected


@pytest.mark.parametrize("window_s, flat_s, windows", [(5.0, 20.0, 4), (5.0, 22.0, 4), (5.0, 2.0, 1), (0.5, 0.5, 1)])
def test_the_windows_a_rule_asks_for(window_s, flat_s, windows):
    assert SettleRule(window_s, flat_s).windows == windows
