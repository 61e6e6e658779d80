"""Segmentation metrics of a model on a set of clips (:mod:`fedmedbench.segmetrics`)."""

from __future__ import annotations

import torch

from fedmedbench.fl.tasks.segmentation.clips import ClipSet
from fedmedbench.segmetrics import METRICS, SegmentationMeter


@torch.no_grad()
def evaluate_clips(model: torch.nn.Module, data: ClipSet, classes: dict[int, str], device: torch.device,
                   batch_size: int, binary: bool = False, class_rule: str = "all_classes") -> dict[str, float]:
    """Metrics of ``model`` on ``data`` (names: ``dice`` .. and ``dice_<class>`` ..); ``class_rule``:
    :data:`fedmedbench.segmetrics.CLASS_RULES`."""
    model.eval()
    meter = SegmentationMeter(classes, binary=binary, class_rule=class_rule, submit=data.cache.submit,
                              max_pending=max(batch_size, 4 * data.cache.workers))
    for x, y in data.batches(batch_size):
        pred = model(x.to(device)).argmax(dim=1).cpu().numpy()
        meter.add(pred, y.numpy())
    return {k.removeprefix("mean_"): v for k, v in meter.result().items()}


def metric_names(classes: dict[int, str]) -> tuple[str, ...]:
    return tuple(METRICS) + tuple(f"{m}_{c}" for m in METRICS for c in classes.values())
