"""Segmentation metrics of a model on a set of clips (:mod:`fedmedbench.segmetrics`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedmedbench.fl.tasks.segmentation.clips import ClipSet
from fedmedbench.segmetrics import METRICS, RESOLUTIONS, SegmentationMeter, native_masks, native_spacing


@torch.no_grad()
def evaluate_clips(model: torch.nn.Module, data: ClipSet, classes: dict[int, str], device: torch.device,
                   batch_size: int, binary: bool = False, class_rule: str = "all_classes", assd: str = "medpy_0_5",
                   resolution: str = "input") -> dict[str, float]:
    """Metrics of ``model`` on ``data`` (names: ``dice`` .. and ``dice_<class>`` ..); ``class_rule``, ``assd``:
    :mod:`fedmedbench.segmetrics`; ``resolution`` (:data:`fedmedbench.segmetrics.RESOLUTIONS`): every metric on
    the masks at the input size (``input``); the same with HD95/ASSD in each native frame's pixels
    (``native_units``); or each prediction upsampled (bilinear logits) to its mask file's size and scored
    against that file (``native``)."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"fedst eval.resolution must be one of {list(RESOLUTIONS)}, got {resolution!r}")
    model.eval()
    meter = SegmentationMeter(classes, binary=binary, class_rule=class_rule, submit=data.cache.submit,
                              max_pending=max(batch_size, 4 * data.cache.workers), assd=assd)
    start = 0
    for x, y in data.batches(batch_size):
        logits = model(x.to(device))
        files = data.mask_paths[start:start + len(y)]
        start += len(y)
        if resolution == "native":
            for one, gt in zip(logits, native_masks(files), strict=True):
                up = F.interpolate(one[None], size=gt.shape, mode="bilinear", align_corners=False)
                meter.add(up.argmax(dim=1)[0].cpu().numpy(), gt)
            continue
        pred = logits.argmax(dim=1).cpu().numpy()
        meter.add(pred, y.numpy(), native_spacing(files, tuple(y.shape[-2:])) if resolution == "native_units" else None)
    return {k.removeprefix("mean_"): v for k, v in meter.result().items()}


def metric_names(classes: dict[int, str]) -> tuple[str, ...]:
    return tuple(METRICS) + tuple(f"{m}_{c}" for m in METRICS for c in classes.values())
