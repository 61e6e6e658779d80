"""Average precision as Ultralytics 8.3 computed it (UltraFlwr pins 8.3.48; its later branch 8.3.100).

Both versions build the precision envelope from the precision-recall points of the detections
sorted by confidence and integrate it at 101 recall points (COCO). They differ past the last
recall the detections reach:

* 8.3.x (``ultralytics/utils/metrics.py``, ``compute_ap``): recall sentinels ``[0, r..., 1]``,
  precision ``[1, p..., 0]``: the envelope falls linearly from the last point to precision 0 at
  recall 1, so the recall never reached still adds a triangle;
* 8.4 (installed): recall ``[0, r..., r_last, 1]``, precision ``[1, p..., 0, 0]``: the envelope
  drops to 0 at the last recall reached.

``ap_rule("ultralytics_8_3")`` makes Ultralytics' ``ap_per_class`` (every validation: the epoch
a client sends, the reported mAPs) use 8.3's ``compute_ap`` for the duration; ``installed``
leaves the installed one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

#: how AP is integrated: as Ultralytics 8.3 (UltraFlwr's pin) or as the installed Ultralytics
AP_RULES = ("ultralytics_8_3", "installed")
_X = np.linspace(0, 1, 101)
_trapz = getattr(np, "trapezoid", None) or np.trapz  # numpy 2 renamed it; the same sum


def compute_ap_83(recall, precision) -> tuple[float, np.ndarray, np.ndarray]:
    """(AP, precision envelope, recall with sentinels) as Ultralytics 8.3.48's ``compute_ap``."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    return float(_trapz(np.interp(_X, mrec, mpre), _X)), mpre, mrec


@contextmanager
def ap_rule(rule: str) -> Iterator[None]:
    """Within the block, Ultralytics' AP follows ``rule`` (:data:`AP_RULES`)."""
    if rule not in AP_RULES:
        raise ValueError(f"ap must be one of {list(AP_RULES)}, got '{rule}'")
    if rule == "installed":
        yield
        return
    from ultralytics.utils import metrics

    installed = metrics.compute_ap
    metrics.compute_ap = compute_ap_83
    try:
        yield
    finally:
        metrics.compute_ap = installed
