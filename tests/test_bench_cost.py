"""The grid-cost arithmetic of the surgical studies (bench/_surgical_cost.py) on hand-made round times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _surgical_cost import evaluations, split_rounds  # noqa: E402


def test_evaluations_count_every_kth_round_and_the_last():
    assert evaluations(300, 10) == 30  # fedst: rounds 10, 20, ..., 300
    assert evaluations(25, 10) == 3  # 10, 20 and the last, 25
    assert evaluations(20, 1) == 20
    assert evaluations(3, 0) == 3  # eval_every 0 reads as every round


def test_training_and_evaluation_time_come_apart():
    train, evaluation, _ = split_rounds([9.0, 2.0, 2.2, 3.1])  # round 1 warms up; only round 4 evaluates
    assert train == pytest.approx(2.1) and evaluation == pytest.approx(1.0)
    assert split_rounds([9.0, 2.0, 1.5])[:2] == (2.0, 0.0)  # an evaluation faster than noise costs nothing, not less
    assert split_rounds([4.0, 3.0])[:2] == (3.0, 0.0)  # too few rounds to split: the last round, evaluation included
