"""Classification metrics agree with hand-computed values and with scikit-learn (the oracle)."""

import math
import warnings

import numpy as np
import pytest
from sklearn import metrics as skm

from fedmedbench.metrics.classification import (
    CLASSIFICATION_METRICS,
    classification_metrics,
    grouped_classification_metrics,
)


def test_known_values():
    y = np.array([0, 0, 1, 1, 1, 2])
    pred = np.array([0, 1, 1, 1, 0, 2])
    probs = np.eye(3)[pred]
    m = classification_metrics(y, probs, loss=0.5)
    assert m["accuracy"] == 4 / 6
    recalls = [1 / 2, 2 / 3, 1.0]
    assert math.isclose(m["balanced_accuracy"], np.mean(recalls))
    assert math.isclose(m["recall"], np.mean(recalls)) and m["recall"] == m["recall_macro"]
    precisions = [1 / 2, 2 / 3, 1.0]
    assert math.isclose(m["precision"], np.mean(precisions)) and m["precision"] == m["precision_macro"]
    f1 = [2 * p * r / (p + r) for p, r in zip(precisions, recalls, strict=True)]
    assert math.isclose(m["f1"], np.mean(f1)) and m["f1"] == m["f1_macro"]
    # one-hot scores: class c's one-vs-rest AUC from the 2x2 table (ties count half)
    aucs = []
    for c in range(3):
        pos, neg = probs[y == c, c], probs[y != c, c]
        aucs.append(np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg]))
    assert math.isclose(m["auc"], np.mean(aucs)) and m["loss"] == 0.5


def test_binary_metrics_are_the_positive_class():
    y = np.array([0, 0, 0, 1, 1])
    pred = np.array([0, 1, 1, 1, 0])  # class 1: tp 1, fp 2, fn 1
    m = classification_metrics(y, np.eye(2)[pred], 0.0)
    assert math.isclose(m["precision"], 1 / 3) and math.isclose(m["recall"], 1 / 2)
    assert math.isclose(m["f1"], 2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # macro: class 0 has precision 1/2, recall 1/3
    assert math.isclose(m["precision_macro"], (1 / 2 + 1 / 3) / 2)
    assert math.isclose(m["recall_macro"], (1 / 3 + 1 / 2) / 2)


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
    sets = grouped_classification_metrics(np.array([0, 1]), np.eye(2), [np.arange(2), np.zeros(0, dtype=int)])
    assert all(math.isnan(v) for v in sets[1].values()) and sets[0]["accuracy"] == 1.0


def _sklearn(y, probs, n_classes):
    """The oracle: scikit-learn, one call per metric (the definitions of fedmedbench.metrics.classification)."""
    pred = probs.argmax(1)
    labels = np.arange(n_classes)
    avg = dict(average="binary", pos_label=1) if n_classes == 2 else dict(average="macro", labels=labels)
    macro = dict(average="macro", labels=labels, zero_division=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {
            "accuracy": skm.accuracy_score(y, pred),
            "balanced_accuracy": skm.balanced_accuracy_score(y, pred),
            "f1": skm.f1_score(y, pred, zero_division=0, **avg),
            "precision": skm.precision_score(y, pred, zero_division=0, **avg),
            "recall": skm.recall_score(y, pred, zero_division=0, **avg),
            "f1_macro": skm.f1_score(y, pred, **macro),
            "precision_macro": skm.precision_score(y, pred, **macro),
            "recall_macro": skm.recall_score(y, pred, **macro),
            "f1_weighted": skm.f1_score(y, pred, average="weighted", labels=labels, zero_division=0),
            "precision_weighted": skm.precision_score(y, pred, average="weighted", labels=labels, zero_division=0),
            "recall_weighted": skm.recall_score(y, pred, average="weighted", labels=labels, zero_division=0),
        }
    classes = [1] if n_classes == 2 else range(n_classes)
    aucs = [skm.roc_auc_score(y == c, probs[:, c]) for c in classes if 0 < (y == c).sum() < len(y)]
    out["auc"] = float(np.mean(aucs)) if aucs else math.nan
    return out


@pytest.mark.parametrize("n_classes", [2, 3, 7])
def test_matches_sklearn_on_random_sets(n_classes):
    rng = np.random.default_rng(n_classes)
    n = 400
    y = rng.integers(0, n_classes, n)
    probs = rng.dirichlet(np.ones(n_classes), n)
    probs[: n // 2] = np.round(probs[: n // 2], 1)  # ties in the scores
    losses = rng.random(n)
    # the whole set, random client-like subsets (some missing classes), one single-class, one tiny
    rows = [np.arange(n)] + [np.sort(rng.choice(n, rng.integers(5, 80), replace=False)) for _ in range(20)]
    rows.append(np.flatnonzero(y == 0)[:10])
    rows.append(np.array([3]))
    skewed = np.flatnonzero(y <= 1)[:30]
    rows.append(skewed)
    got = grouped_classification_metrics(y, probs, rows, losses)
    assert len(got) == len(rows)
    for r, m in zip(rows, got, strict=True):
        want = _sklearn(y[r], probs[r], n_classes)
        assert set(m) == set(CLASSIFICATION_METRICS)
        assert m["loss"] == losses[r].mean()
        for k, v in want.items():
            if math.isnan(v):
                assert math.isnan(m[k]), k
            else:
                assert abs(m[k] - v) <= 1e-12, (k, m[k], v)


def test_multiclass_auc_is_medmnists():
    """MedMNIST's Evaluator: mean over classes of roc_auc_score(y == c, score[:, c])."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 25)
    probs = rng.dirichlet(np.ones(4), 100)
    want = np.mean([skm.roc_auc_score((y == c).astype(float), probs[:, c]) for c in range(4)])
    assert abs(classification_metrics(y, probs, 0.0)["auc"] - want) <= 1e-12
