"""Which detections of an image are true positives at each IoU threshold, as Ultralytics 8.3.48 decided it.

Every mAP rests on this decision (the epoch a client sends, the ID/CD matrix, Tables II/III). Both versions see the
image's predictions in the validator's order (NMS output, most confident first); a prediction can only match a
box of its own class. At threshold t:

* 8.3.48 (UltraFlwr's pin): each prediction proposes the box it overlaps most, if that IoU is >= t, whether or not
  another prediction proposes it too; a box proposed by several goes to the first of them, and the others are false
  positives, even where another free box overlaps them by >= t;
* the installed Ultralytics (8.4): each prediction in turn takes the free box it overlaps most, so one whose best
  box is taken falls back to its next best free box.

They differ only in that fall-back. ``match_rule("ultralytics_8_3")`` makes every Ultralytics validator match as
8.3.48 within the block; ``installed`` leaves the installed rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

#: how a validation matches predictions to boxes: as Ultralytics 8.3.48 (UltraFlwr's pin) or as the installed one
MATCH_RULES = ("ultralytics_8_3", "installed")


def match_83(pred_cls: np.ndarray, true_cls: np.ndarray, iou: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """(predictions, thresholds) bool: Ultralytics 8.3.48's true positives. ``iou`` is (boxes, predictions), the
    predictions in the validator's order. Where one prediction overlaps two boxes exactly equally it proposes the
    later box (what 8.3.48's sort gives on an image's few pairs)."""
    pred_cls, true_cls = np.asarray(pred_cls).reshape(-1), np.asarray(true_cls).reshape(-1)
    overlap = np.where(true_cls[:, None] == pred_cls[None, :], np.asarray(iou, dtype=np.float64), 0.0)
    correct = np.zeros((len(pred_cls), len(thresholds)), dtype=bool)
    if overlap.size == 0:
        return correct
    proposed = len(true_cls) - 1 - overlap[::-1].argmax(0)  # each prediction's best box (the later one on ties)
    best = overlap[proposed, np.arange(len(pred_cls))]
    for k, t in enumerate(np.asarray(thresholds, dtype=np.float64)):
        proposers = np.flatnonzero(best >= t)
        _, first = np.unique(proposed[proposers], return_index=True)  # each box to its first proposer
        correct[proposers[first], k] = True
    return correct


@contextmanager
def match_rule(rule: str) -> Iterator[None]:
    """Within the block, Ultralytics' validators match predictions by ``rule`` (:data:`MATCH_RULES`), on their own
    thresholds (``iouv``); the optimal assignment (``use_scipy``), which neither version uses by default, is left."""
    if rule not in MATCH_RULES:
        raise ValueError(f"match must be one of {list(MATCH_RULES)}, got '{rule}'")
    if rule == "installed":
        yield
        return
    import torch
    from ultralytics.engine.validator import BaseValidator

    installed = BaseValidator.match_predictions

    def match_predictions(self, pred_classes, true_classes, iou, use_scipy=False):
        if use_scipy:
            return installed(self, pred_classes, true_classes, iou, use_scipy)
        tp = match_83(pred_classes.cpu().numpy(), true_classes.cpu().numpy(), iou.cpu().numpy(), self.iouv.cpu().numpy())
        return torch.from_numpy(tp)

    BaseValidator.match_predictions = match_predictions
    try:
        yield
    finally:
        BaseValidator.match_predictions = installed
