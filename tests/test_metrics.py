"""Classification metrics agree with hand-computed values."""

import math

import numpy as np

from fedmedbench.metrics import classification_metrics


def test_known_values():
    y = np.array([0, 0, 1, 1, 1, 2])
    pred = np.array([0, 1, 1, 1, 0, 2])
    probs = np.eye(3)[pred]
    m = classification_metrics(y, probs, loss=0.5)
    assert m["accuracy"] == 4 / 6
    recalls = [1 / 2, 2 / 3, 1.0]
    assert math.isclose(m["balanced_accuracy"], np.mean(recalls))
    assert math.isclose(m["recall"], np.mean(recalls))
    precisions = [1 / 2, 2 / 3, 1.0]
    assert math.isclose(m["precision"], np.mean(precisions))
    f1 = [2 * p * r / (p + r) for p, r in zip(precisions, recalls, strict=True)]
    assert math.isclose(m["f1"], np.mean(f1))
    assert math.isnan(m["auc"]) and m["loss"] == 0.5


def test_binary_auc_and_single_class():
    y = np.array([0, 0, 1, 1])
    p1 = np.array([0.1, 0.6, 0.4, 0.9])
    m = classification_metrics(y, np.stack([1 - p1, p1], 1), 0.0)
    assert math.isclose(m["auc"], 0.75)
    single = classification_metrics(np.array([1, 1]), np.array([[0.2, 0.8], [0.6, 0.4]]), 0.0)
    assert math.isnan(single["auc"]) and single["accuracy"] == 0.5


def test_empty_set_is_nan():
    m = classification_metrics(np.zeros(0), np.zeros((0, 2)), math.nan)
    assert all(math.isnan(v) for v in m.values())
