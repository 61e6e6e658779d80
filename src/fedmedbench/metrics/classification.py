"""Classification metrics, named the same way everywhere, for many evaluated sets in one pass.

Names (every evaluation returns all of them):

* ``loss``: mean cross-entropy; ``accuracy``.
* ``balanced_accuracy``: mean recall over the classes present in the labels (scikit-learn's
  ``balanced_accuracy_score``; what the early-stopping paper reports).
* ``f1``, ``precision``, ``recall``: for 2-class tasks the positive class's (class 1, as
  scikit-learn's ``average="binary"``); for more classes the macro average over all classes.
* ``f1_macro``, ``precision_macro``, ``recall_macro``: always the macro average over all classes.
  A class never predicted (or never present) counts 0, as scikit-learn's ``zero_division=0``.
* ``f1_weighted``, ``precision_weighted``, ``recall_weighted``: the per-class values averaged with the classes'
  true counts as weights (scikit-learn's ``average="weighted"``; ``recall_weighted`` equals ``accuracy``).
* ``auc``: ROC AUC. 2 classes: of the positive class's score. More classes: one-vs-rest macro
  AUC as MedMNIST's ``Evaluator`` computes it (the AUC of ``y == c`` against ``score[:, c]`` per
  class, averaged); a class whose one-vs-rest AUC is undefined (absent from, or alone in, the
  evaluated labels, as in a non-IID client's split) is left out of the average. NaN when no
  class has one (e.g. a single-class set).

Why one pass: the server evaluates the global test set and every client's test split each
round. One scikit-learn call per client per metric cost seconds per round with 100 clients;
here the confusion matrices of all sets come from one ``bincount`` over (set, true, predicted)
and the AUCs from one rank computation over (class, set), in torch on the device the scores
are on. ``tests/test_metrics.py`` checks every value against scikit-learn on random inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

CLASSIFICATION_METRICS = ("loss", "accuracy", "balanced_accuracy", "f1", "precision", "recall",
                          "f1_macro", "precision_macro", "recall_macro", "f1_weighted", "precision_weighted",
                          "recall_weighted", "auc")


def classification_metrics(y_true, probs, loss: float) -> dict[str, float]:
    """Metrics of one evaluated set from true labels and class probabilities (N x C)."""
    y = np.asarray(y_true)
    out = grouped_classification_metrics(y, probs, [np.arange(len(y))])[0]
    out["loss"] = float(loss) if len(y) else math.nan
    return out


def grouped_classification_metrics(
    y_true, probs, rows: Sequence, losses=None, device: torch.device | str | None = None
) -> list[dict[str, float]]:
    """Metrics of several evaluated sets of one prediction, in one pass.

    ``rows[g]`` are the row indices (into ``y_true``/``probs``, N x C) of set ``g``; sets may
    overlap (e.g. the whole set and each client's part). ``losses`` (N per-sample
    cross-entropies) gives each set's mean loss, else ``loss`` is NaN. Computed on ``device``
    (default: where ``probs`` is, CPU for numpy). An empty set gets NaN everywhere.
    """
    p = torch.as_tensor(probs)
    dev = torch.device(device) if device is not None else p.device
    p = p.to(dev, torch.float64)
    y = torch.as_tensor(np.asarray(y_true) if not torch.is_tensor(y_true) else y_true).to(dev, torch.int64).reshape(-1)
    n_classes = int(p.shape[1]) if p.dim() == 2 else 1
    sizes = [len(r) for r in rows]
    n_sets = len(rows)
    if sum(sizes):
        idx = torch.as_tensor(np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]), device=dev)
    else:
        idx = torch.zeros(0, dtype=torch.int64, device=dev)
    group = torch.repeat_interleave(torch.arange(n_sets, device=dev), torch.as_tensor(sizes, device=dev))
    yt, pr = y[idx], p[idx]
    pred = pr.argmax(dim=1) if len(idx) else torch.zeros(0, dtype=torch.int64, device=dev)
    cm = torch.bincount((group * n_classes + yt) * n_classes + pred, minlength=n_sets * n_classes * n_classes)
    cm = cm.reshape(n_sets, n_classes, n_classes).to(torch.float64)
    values = _from_confusion(cm)
    values["auc"] = _auc(yt, pr, group, n_sets, n_classes)
    table = {k: v.tolist() for k, v in values.items()}
    loss = _set_losses(losses, rows)
    out = []
    for g in range(n_sets):
        if sizes[g] == 0:
            out.append({k: math.nan for k in CLASSIFICATION_METRICS})
            continue
        out.append({"loss": loss[g], **{k: float(table[k][g]) for k in CLASSIFICATION_METRICS if k != "loss"}})
    return out


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, 0 where den is 0 (scikit-learn's zero_division=0)."""
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num))


def _from_confusion(cm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-set metrics from confusion matrices (sets x true x predicted)."""
    tp = torch.diagonal(cm, dim1=1, dim2=2)
    support = cm.sum(dim=2)  # true counts per class
    predicted = cm.sum(dim=1)
    n = support.sum(dim=1)
    recall = _ratio(tp, support)
    precision = _ratio(tp, predicted)
    f1 = _ratio(2 * tp, support + predicted)
    present = support > 0
    out = {
        "accuracy": _ratio(tp.sum(dim=1), n),
        "balanced_accuracy": _ratio((recall * present).sum(dim=1), present.sum(dim=1).to(cm.dtype)),
        "f1_macro": f1.mean(dim=1), "precision_macro": precision.mean(dim=1), "recall_macro": recall.mean(dim=1),
    }
    share = _ratio(support, n[:, None])  # each class's weight: its share of the true labels
    out.update(f1_weighted=(f1 * share).sum(dim=1), precision_weighted=(precision * share).sum(dim=1),
               recall_weighted=(recall * share).sum(dim=1))
    if cm.shape[1] == 2:
        out.update(f1=f1[:, 1], precision=precision[:, 1], recall=recall[:, 1])
    else:
        out.update(f1=out["f1_macro"], precision=out["precision_macro"], recall=out["recall_macro"])
    return out


def _auc(y: torch.Tensor, probs: torch.Tensor, group: torch.Tensor, n_sets: int, n_classes: int) -> torch.Tensor:
    """ROC AUC per set (see the module docstring) by the rank-sum (Mann-Whitney) formula.

    AUC = (sum of the positives' ranks - P(P+1)/2) / (P N), ranks within the set, ties given
    their average rank: equal to the area under scikit-learn's ROC curve, ties included.
    """
    dev = probs.device
    classes = [1] if n_classes == 2 else list(range(n_classes))
    k = len(classes)
    m = len(y)
    if m == 0:
        return torch.full((n_sets,), math.nan, dtype=torch.float64, device=dev)
    cls = torch.as_tensor(classes, device=dev)
    score = probs[:, cls].T.reshape(-1)  # (class, row) flattened
    pos = (y[None, :] == cls[:, None]).reshape(-1).to(torch.float64)
    key = (torch.arange(k, device=dev)[:, None] * n_sets + group[None, :]).reshape(-1)
    # sort by (key, score): stable sort by score, then stable sort by key
    o1 = torch.argsort(score, stable=True)
    o2 = torch.argsort(key[o1], stable=True)
    order = o1[o2]
    key_s, score_s, pos_s = key[order], score[order], pos[order]
    n_keys = k * n_sets
    count = torch.bincount(key_s, minlength=n_keys)
    start = torch.cumsum(count, 0) - count
    position = torch.arange(len(key_s), device=dev) - start[key_s] + 1  # 1-based rank within (class, set)
    new_run = torch.ones(len(key_s), dtype=torch.bool, device=dev)
    new_run[1:] = (key_s[1:] != key_s[:-1]) | (score_s[1:] != score_s[:-1])
    run = torch.cumsum(new_run.to(torch.int64), 0) - 1
    n_runs = int(run[-1]) + 1
    run_sum = torch.zeros(n_runs, dtype=torch.float64, device=dev).index_add_(0, run, position.to(torch.float64))
    run_len = torch.bincount(run, minlength=n_runs).to(torch.float64)
    rank = (run_sum / run_len)[run]
    n_pos = torch.zeros(n_keys, dtype=torch.float64, device=dev).index_add_(0, key_s, pos_s)
    rank_pos = torch.zeros(n_keys, dtype=torch.float64, device=dev).index_add_(0, key_s, rank * pos_s)
    n_neg = count.to(torch.float64) - n_pos
    defined = (n_pos > 0) & (n_neg > 0)
    auc = (rank_pos - n_pos * (n_pos + 1) / 2) / torch.where(defined, n_pos * n_neg, torch.ones_like(n_pos))
    auc = torch.where(defined, auc, torch.zeros_like(auc)).reshape(k, n_sets)
    n_defined = defined.reshape(k, n_sets).sum(dim=0)
    return torch.where(n_defined > 0, auc.sum(dim=0) / n_defined.clamp(min=1), torch.full_like(auc[0], math.nan))


def _set_losses(losses, rows: Sequence) -> list[float]:
    """Mean per-sample loss of each set (numpy's mean, as a single-set evaluation computes it)."""
    if losses is None:
        return [math.nan] * len(rows)
    arr = losses.detach().cpu().numpy() if torch.is_tensor(losses) else np.asarray(losses)
    return [float(arr[np.asarray(r, dtype=np.int64)].mean()) if len(r) else math.nan for r in rows]
