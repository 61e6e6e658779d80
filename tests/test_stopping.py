"""Early-stopping rules on hand-computed sequences (docs/earlystop.md, fidelity table)."""

import math

import pytest
import torch

from fedmedbench.fl.stopping import (
    DataFreeMonitor,
    datafree_stop,
    growth_rates,
    reported_round,
    saturation,
    validation_stop,
)

NORMS = [1.0, 2.0, 2.1, 2.11, 2.115, 2.6]


def test_growth_rate_by_hand():
    g = growth_rates(NORMS)
    assert math.isnan(g[0])
    assert g[1:] == pytest.approx([1.0, 0.05, 0.1 / 21, 0.005 / 2.11, 0.485 / 2.115])
    # the reference sets g = 1 after a distance <= 1e-6 (and after a NaN distance); the paper reading: inf
    assert growth_rates([0.0, 0.5, math.nan, 1.0])[1:] == [1.0, pytest.approx(math.nan, nan_ok=True), 1.0]
    assert growth_rates([0.0, 0.5], counting="paper")[1] == math.inf


def test_paper_counting_counts_from_g2():
    g = growth_rates(NORMS, "paper")
    assert saturation(g, tau=0.01, counting="paper") == [0, 0, 0, 1, 2, 0]
    assert datafree_stop(NORMS, tau=0.01, patience=2, counting="paper") == 5
    assert datafree_stop(NORMS, tau=0.01, patience=3, counting="paper") is None
    assert datafree_stop(NORMS, tau=0.06, patience=1, counting="paper") == 3  # r* >= 2 and kappa_3 = 1
    assert datafree_stop(NORMS, tau=1.5, patience=1, counting="paper") == 2  # g_2 = 1.0 counts


def test_reference_counting_skips_g2_and_zero_growth():
    # server.py: the counter moves only for t > 1 (0-based), i.e. from round 3, and not when g == 0
    assert datafree_stop(NORMS, tau=1.5, patience=1) == 3  # g_2 < 1.5 is not counted
    assert saturation(growth_rates(NORMS), tau=0.01) == [0, 0, 0, 1, 2, 0]
    flat = [1.0, 1.0, 1.0, 1.001, 1.001, 1.002]  # g = 0, 0, 0.001, 0, ~0.001
    assert saturation(growth_rates(flat), tau=0.01) == [0, 0, 0, 1, 1, 2]  # zeros leave kappa unchanged
    assert saturation(growth_rates(flat, "paper"), tau=0.01, counting="paper") == [0, 1, 2, 3, 4, 5]
    # every round below tau from round 2 on: paper fires at 1 + rho, the reference one round later
    steady = [1.0] + [1.0 + 1e-4 * r for r in range(1, 15)]
    assert datafree_stop(steady, 0.01, 10, "paper") == 11
    assert datafree_stop(steady, 0.01, 10) == 12


def test_round_numbering():
    # the reference prints its 0-based loop index t for round r = t + 1
    assert reported_round(12) == 11.0 and reported_round(12, "one_based") == 12.0
    assert math.isnan(reported_round(None)) and math.isnan(reported_round(float("nan")))
    with pytest.raises(ValueError, match="round_numbering"):
        reported_round(3, "two_based")


def test_monitor_matches_the_pure_rule():
    theta0 = {"w": torch.zeros(3, dtype=torch.float64)}
    for counting in ("reference", "paper"):
        mon = DataFreeMonitor(tau=0.01, patience=2, counting=counting)
        rows = []
        for n in NORMS:
            rows.append(mon.update(rows, DataFreeMonitor.task_norm({"w": torch.tensor([n, 0.0, 0.0], dtype=torch.float64)}, theta0)))
        assert [r["saturation"] for r in rows] == saturation(growth_rates(NORMS, counting), 0.01, counting)
        first = next(i + 1 for i, r in enumerate(rows) if r["datafree_stop"])
        assert first == datafree_stop(NORMS, 0.01, 2, counting)


def test_validation_absolute_margins_as_the_reference():
    loss = [1.0, 0.8, 0.79, 0.85, 0.9, 0.7]
    assert validation_stop(loss, patience=2, mode="min") == 5  # best 0.79 at r3 (beats 0.8 by > 0)
    assert validation_stop(loss, patience=2, mode="min", tau=0.05) == 4  # 0.79 not below 0.8 - 0.05
    # accuracy in percentage points: tau = 1 point; 0.505 -> 50.5 does not beat 50 + 1
    acc = [0.40, 0.50, 0.505, 0.52, 0.52, 0.52]
    assert validation_stop(acc, patience=2, mode="max", tau=1.0, scale=100) == 6  # best 52 at r4
    assert validation_stop(acc, patience=2, mode="max", tau=2.5, scale=100) == 4  # 50.5, 52 < 50 + 2.5
    # the best starts at +inf (loss) and 0 (accuracy): NaN never improves; 0 accuracy is no improvement
    assert validation_stop([math.nan, math.nan, 0.5], patience=2, mode="min") == 2
    assert validation_stop([0.0, 0.0, 0.3], patience=2, mode="max", tau=0.01, scale=100) == 2
    assert validation_stop(acc, patience=10, mode="max") is None


def test_validation_relative_option():
    loss = [1.0, 0.8, 0.79, 0.85, 0.9, 0.7]
    assert validation_stop(loss, 2, "min", tau=0.05, min_delta="relative") == 4  # 0.79 is not 5% below 0.8
    acc = [0.1, 0.5, 0.52, 0.6, 0.6, 0.6]
    assert validation_stop(acc, 2, "max", tau=0.1, min_delta="relative") == 6  # 0.6 beats 0.5 by > 10%
    assert validation_stop(acc, 2, "max", tau=0.2, min_delta="relative") == 4
    with pytest.raises(ValueError):
        validation_stop(acc, 2, "median")
    with pytest.raises(ValueError, match="min_delta"):
        validation_stop(acc, 2, "max", min_delta="sideways")
    with pytest.raises(ValueError):
        saturation([math.nan, 0.1], tau=0)
