"""The rules a segmentation score follows, torch- and MedPy-free: the metric and rule names, the empty-mask
rule (:mod:`fedmedbench.metrics.segmentation`'s docstring), and how a run's frames are scored where its config
says nothing: one source for the evaluation (:func:`fedmedbench.fl.tasks.segmentation.evaluation.scoring`, with torch) and for the FedST workflow while
it plans (:func:`fedmedbench.studies.fedst.runs.scoring_config`, without torch). The schema's defaults of
``fedst.eval`` mirror it (``tests/test_segmetrics_device.py``)."""

from __future__ import annotations

import math

#: keyword of ``evaluate_clips`` -> its default: the class rule (:data:`CLASS_RULES`), the ASSD
#: definition (:data:`ASSD_RULES`), the resolution (:data:`RESOLUTIONS`), where frames are
#: scored (``evaluation.METRICS_DEVICES``) and the empty-mask rule (:data:`EMPTY_RULES`)
SCORING_DEFAULTS: dict[str, str] = {"class_rule": "all_classes", "assd": "medpy_0_5", "resolution": "input",
                                    "metrics_device": "auto", "empty_rule": "diagonal"}

METRICS: tuple[str, ...] = ("dice", "iou", "hd95", "assd")
#: which classes a frame's score covers (``metrics.segmentation``'s docstring)
CLASS_RULES: tuple[str, ...] = ("all_classes", "gt_classes")
#: where a frame is scored: the masks at the input size, the same with distances in native pixels, or the
#: prediction upsampled to the native mask (``fl.tasks.segmentation.evaluate_clips``)
RESOLUTIONS: tuple[str, ...] = ("input", "native_units", "native")
#: how ASSD averages the two directions' surface distances (``metrics.segmentation``'s docstring)
ASSD_RULES: tuple[str, ...] = ("medpy_0_5", "medpy_0_4")
#: a part empty in exactly one mask (``metrics.segmentation``'s docstring): the image diagonal, or FedDP's
#: one pixel at (0, 0) in an empty prediction (``scripts/tester_utils.py:101-102``)
EMPTY_RULES: tuple[str, ...] = ("diagonal", "feddp_pixel")
#: larger is better for these (the others are distances)
HIGHER_IS_BETTER = {"dice": True, "iou": True, "hd95": False, "assd": False}


Spacing = tuple[float, ...] | None


def empty_penalty(shape: tuple[int, ...], spacing: Spacing = None) -> float:
    """The distance assigned when exactly one of prediction / ground truth is empty: the image diagonal."""
    spacing = spacing or (1.0,) * len(shape)
    return float(math.sqrt(sum((s * d) ** 2 for s, d in zip(shape, spacing, strict=True))))


def empty_mask_scores(p_any: bool, g_any: bool, shape: tuple[int, ...], spacing: Spacing = None) -> dict[str, float] | None:
    """The empty-mask rule (``metrics.segmentation``'s docstring) for a pair whose prediction / ground truth holds any pixel
    (``p_any`` / ``g_any``): perfect when both are empty, worst when one is; None when neither is."""
    if not p_any and not g_any:
        return {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}
    if p_any != g_any:
        worst = empty_penalty(shape, spacing)
        return {"dice": 0.0, "iou": 0.0, "hd95": worst, "assd": worst}
    return None


def check_empty_rule(rule: str) -> None:
    if rule not in EMPTY_RULES:
        raise ValueError(f"empty_rule must be one of {EMPTY_RULES}, got {rule!r}")


def sets_feddp_pixel(rule: str, p_any: bool, g_any: bool) -> bool:
    """Whether ``feddp_pixel`` sets pixel (0, 0) of this pair's prediction: it is empty, the ground truth is not."""
    return rule == "feddp_pixel" and not p_any and g_any
