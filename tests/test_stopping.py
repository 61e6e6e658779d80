"""Early-stopping rules on hand-computed sequences."""

import math

import pytest

from fedmedbench.fl.stopping import DataFreeMonitor, datafree_stop, growth_rates, saturation, validation_stop


def test_growth_rate_and_saturation_by_hand():
    norms = [1.0, 2.0, 2.1, 2.11, 2.115, 2.6]
    g = growth_rates(norms)
    assert math.isnan(g[0])
    assert g[1:] == pytest.approx([1.0, 0.05, 0.1 / 21, 0.005 / 2.11, 0.485 / 2.115])
    assert saturation(g, tau=0.01) == [0, 0, 0, 1, 2, 0]
    assert datafree_stop(norms, tau=0.01, patience=2) == 5
    assert datafree_stop(norms, tau=0.01, patience=3) is None
    assert datafree_stop(norms, tau=0.06, patience=1) == 3  # r* >= 2 and kappa_3 = 1


def test_monitor_matches_the_pure_rule():
    import numpy as np

    theta0 = {"w": np.zeros(3)}
    mon = DataFreeMonitor(tau=0.01, patience=2)
    rows, norms = [], [1.0, 2.0, 2.1, 2.11, 2.115, 2.6]
    for n in norms:
        row = mon.update(rows, DataFreeMonitor.task_norm({"w": np.array([n, 0, 0])}, theta0))
        rows.append(row)
    assert [r["saturation"] for r in rows] == saturation(growth_rates(norms), 0.01)
    first = next(i + 1 for i, r in enumerate(rows) if r["datafree_stop"])
    assert first == datafree_stop(norms, 0.01, 2)


def test_validation_rules():
    loss = [1.0, 0.8, 0.79, 0.85, 0.9, 0.7]
    assert validation_stop(loss, patience=2, mode="min") == 5  # best 0.79 at r3, no improvement r4, r5
    assert validation_stop(loss, patience=2, mode="min", tau=0.05) == 4  # 0.79 is not 5% better than 0.8
    acc = [0.1, 0.5, 0.52, 0.6, 0.6, 0.6]
    assert validation_stop(acc, patience=2, mode="max") == 6
    assert validation_stop(acc, patience=2, mode="max", tau=0.1) == 6  # 0.6 beats 0.5 by >10%
    assert validation_stop(acc, patience=2, mode="max", tau=0.2) == 4  # 0.52, 0.6 are not 20% better than 0.5
    assert validation_stop(acc, patience=2, mode="max", tau=0.05, min_delta="absolute") == 6
    assert validation_stop(acc, patience=10, mode="max") is None
    with pytest.raises(ValueError):
        validation_stop(acc, 2, "median")
    with pytest.raises(ValueError):
        saturation([math.nan, 0.1], tau=0)
