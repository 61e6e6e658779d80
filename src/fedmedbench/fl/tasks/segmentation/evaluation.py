"""Segmentation metrics of a model on a set of clips (:mod:`fedmedbench.metrics.segmentation`)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedmedbench.fl.tasks.segmentation.clips import ClipSet
from fedmedbench.metrics.scoring import SCORING_DEFAULTS
from fedmedbench.metrics.segmentation import (
    METRICS,
    RESOLUTIONS,
    SegmentationMeter,
    native_masks,
    native_spacing,
)

#: where frames are scored: ``auto`` = with torch on the model's device when that is a GPU, else with
#: NumPy/SciPy (:mod:`fedmedbench.metrics.segmentation`); ``cpu`` = always NumPy/SciPy; ``torch`` = always torch on the
#: model's device (:mod:`fedmedbench.metrics.segmentation_device`, the CPU included)
METRICS_DEVICES: tuple[str, ...] = ("auto", "cpu", "torch")


def scores_on_device(metrics_device: str, device: torch.device) -> bool:
    """Whether ``metrics_device`` (:data:`METRICS_DEVICES`) scores with torch for a model on ``device``."""
    if metrics_device not in METRICS_DEVICES:
        raise ValueError(f"fedst eval.metrics_device must be one of {list(METRICS_DEVICES)}, got {metrics_device!r}")
    return metrics_device == "torch" or (metrics_device == "auto" and torch.device(device).type == "cuda")


def scoring(task_params: dict) -> dict[str, str]:
    """How :func:`evaluate_clips` scores a run's frames (its keyword arguments), from the run's task parameters:
    class rule, ASSD definition, resolution and where, each defaulting as :func:`evaluate_clips` does
    (:data:`fedmedbench.metrics.scoring.SCORING_DEFAULTS`)."""
    return {key: str(task_params.get(key, default)) for key, default in SCORING_DEFAULTS.items()}


@torch.no_grad()
def evaluate_clips(model: torch.nn.Module, data: ClipSet, classes: dict[int, str], device: torch.device,
                   batch_size: int, binary: bool = False, class_rule: str = SCORING_DEFAULTS["class_rule"],
                   assd: str = SCORING_DEFAULTS["assd"], resolution: str = SCORING_DEFAULTS["resolution"],
                   metrics_device: str = SCORING_DEFAULTS["metrics_device"],
                   empty_rule: str = SCORING_DEFAULTS["empty_rule"]) -> dict[str, float]:
    """Metrics of ``model`` on ``data`` (names: ``dice`` .. and ``dice_<class>`` ..); ``class_rule``, ``assd``:
    :mod:`fedmedbench.metrics.segmentation`; ``resolution`` (:data:`fedmedbench.metrics.segmentation.RESOLUTIONS`): every metric on
    the masks at the input size (``input``); the same with HD95/ASSD in each native frame's pixels
    (``native_units``); or each prediction upsampled (bilinear logits) to its mask file's size and scored
    against that file (``native``); ``metrics_device`` (:data:`METRICS_DEVICES`): where the frames are scored;
    ``empty_rule`` (:data:`fedmedbench.metrics.scoring.EMPTY_RULES`): a part empty in exactly one mask."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"fedst eval.resolution must be one of {list(RESOLUTIONS)}, got {resolution!r}")
    on_device = scores_on_device(metrics_device, device)
    model.eval()
    meter = SegmentationMeter(classes, binary=binary, class_rule=class_rule, submit=data.cache.submit,
                              max_pending=max(batch_size, 4 * data.cache.workers), assd=assd, empty_rule=empty_rule)
    start = 0
    for x, y in data.batches(batch_size):
        logits = model(x.to(device))
        files = data.mask_paths[start:start + len(y)]
        start += len(y)
        if resolution == "native":
            for one, gt in zip(logits, native_masks(files), strict=True):
                up = F.interpolate(one[None], size=gt.shape, mode="bilinear", align_corners=False)
                if on_device:
                    meter.add_on_device(up.argmax(dim=1), torch.as_tensor(np.array(gt), device=up.device)[None])
                else:
                    meter.add(up.argmax(dim=1)[0].cpu().numpy(), gt)
            continue
        spacing = native_spacing(files, tuple(y.shape[-2:])) if resolution == "native_units" else None
        if on_device:
            meter.add_on_device(logits.argmax(dim=1), y.to(logits.device), spacing)
        else:
            meter.add(logits.argmax(dim=1).cpu().numpy(), y.numpy(), spacing)
    return {k.removeprefix("mean_"): v for k, v in meter.result().items()}


def metric_names(classes: dict[int, str]) -> tuple[str, ...]:
    return tuple(METRICS) + tuple(f"{m}_{c}" for m in METRICS for c in classes.values())
