"""Segmentation metrics (Dice, IoU, HD95, ASSD) backed by MedPy, with one empty-mask rule.

The overlap and surface-distance computations are MedPy's (``medpy.metric.binary``: ``dc``,
``jc``, ``hd95``, ``assd``); this module only decides what MedPy leaves undefined, which
is what happens when a structure is absent from the prediction or the ground truth:

* both empty (the part is absent and none is predicted): a perfect score, Dice = IoU = 1,
  HD95 = ASSD = 0;
* exactly one empty (a part is missed, or hallucinated): the worst score, Dice = IoU = 0,
  HD95 = ASSD = the image diagonal in pixels (the largest distance two pixels of the image
  can have), so a missed part can never look better than any detected one.

Scores are computed per frame and per foreground class (classes 1..C-1; background is left
out of the averages as in the EndoVis part-segmentation protocol) and then averaged over
frames; ``mean_<metric>`` averages the per-class values. Distances are in pixels (spacing 1),
as the FedST paper reports them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from medpy.metric import binary as mb

METRICS: tuple[str, ...] = ("dice", "iou", "hd95", "assd")
#: larger is better for these (the others are distances)
HIGHER_IS_BETTER = {"dice": True, "iou": True, "hd95": False, "assd": False}


def empty_penalty(shape: tuple[int, ...]) -> float:
    """The distance assigned when exactly one of prediction / ground truth is empty."""
    return float(math.sqrt(sum(s * s for s in shape)))


def binary_scores(pred: np.ndarray, gt: np.ndarray) -> dict[str, float]:
    """Dice, IoU, HD95, ASSD of one binary mask pair, with the documented empty-mask rule."""
    pred = np.asarray(pred, dtype=bool)
    gt = np.asarray(gt, dtype=bool)
    if pred.shape != gt.shape:
        raise ValueError(f"prediction shape {pred.shape} != ground-truth shape {gt.shape}")
    p_any, g_any = bool(pred.any()), bool(gt.any())
    if not p_any and not g_any:
        return {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}
    if p_any != g_any:
        worst = empty_penalty(pred.shape)
        return {"dice": 0.0, "iou": 0.0, "hd95": worst, "assd": worst}
    return {"dice": float(mb.dc(pred, gt)), "iou": float(mb.jc(pred, gt)),
            "hd95": float(mb.hd95(pred, gt)), "assd": float(mb.assd(pred, gt))}


def frame_scores(pred: np.ndarray, gt: np.ndarray, classes: Iterable[int]) -> dict[int, dict[str, float]]:
    """Per-class scores of one label map pair (``classes``: the label values to score)."""
    return {c: binary_scores(pred == c, gt == c) for c in classes}


class SegmentationMeter:
    """Accumulates per-frame, per-class scores; :meth:`result` averages over frames.

    ``class_names`` maps label value -> name for the foreground classes scored.
    ``binary=True`` collapses every non-zero label of prediction and ground truth into one
    foreground class (the unseen binary set: all parts = instrument).
    """

    def __init__(self, class_names: dict[int, str], binary: bool = False) -> None:
        self.binary = binary
        self.class_names = {1: "instrument"} if binary else dict(class_names)
        self._rows: list[dict[int, dict[str, float]]] = []

    def add(self, pred: np.ndarray, gt: np.ndarray) -> None:
        """One frame (2-D label maps) or a batch (N, H, W)."""
        pred, gt = np.asarray(pred), np.asarray(gt)
        if pred.ndim == 2:
            pred, gt = pred[None], gt[None]
        for p, g in zip(pred, gt, strict=True):
            if self.binary:
                p, g = (p > 0).astype(np.uint8), (g > 0).astype(np.uint8)
            self._rows.append(frame_scores(p, g, self.class_names))

    def __len__(self) -> int:
        return len(self._rows)

    def result(self) -> dict[str, float]:
        """``<metric>_<class>`` per class and ``mean_<metric>`` (mean over classes); NaN if no frame."""
        out: dict[str, float] = {}
        for m in METRICS:
            per_class = []
            for c, name in self.class_names.items():
                v = float(np.mean([r[c][m] for r in self._rows])) if self._rows else math.nan
                out[f"{m}_{name}"] = v
                per_class.append(v)
            out[f"mean_{m}"] = float(np.mean(per_class)) if self._rows else math.nan
        return out
