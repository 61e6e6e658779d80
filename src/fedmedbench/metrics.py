"""Classification metrics (scikit-learn), named the same way everywhere.

``accuracy``, ``balanced_accuracy`` (macro-averaged recall, what the early-stopping
paper reports), ``f1``/``precision``/``recall`` (macro), ``auc`` (binary tasks only;
NaN when the evaluated set holds a single class) and ``loss`` (mean cross-entropy).
"""

from __future__ import annotations

import math

import numpy as np
from sklearn import metrics as skm

CLASSIFICATION_METRICS = ("loss", "accuracy", "balanced_accuracy", "f1", "precision", "recall", "auc")


def classification_metrics(y_true: np.ndarray, probs: np.ndarray, loss: float) -> dict[str, float]:
    """Metrics from true labels and predicted class probabilities (N x C)."""
    y_true = np.asarray(y_true)
    if len(y_true) == 0:
        return {k: math.nan for k in CLASSIFICATION_METRICS}
    n_classes = probs.shape[1]
    y_pred = probs.argmax(axis=1)
    labels = np.arange(n_classes)
    out = {
        "loss": float(loss),
        "accuracy": float(skm.accuracy_score(y_true, y_pred)),
        "balanced_accuracy": float(_balanced_accuracy(y_true, y_pred)),
        "f1": float(skm.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "precision": float(skm.precision_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "recall": float(skm.recall_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "auc": math.nan,
    }
    if n_classes == 2 and len(np.unique(y_true)) == 2:
        out["auc"] = float(skm.roc_auc_score(y_true, probs[:, 1]))
    return out


def _balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """sklearn's balanced accuracy (mean recall over classes present in y_true)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return skm.balanced_accuracy_score(y_true, y_pred)
