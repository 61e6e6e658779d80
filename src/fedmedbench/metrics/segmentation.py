"""Segmentation metrics (Dice, IoU, HD95, ASSD) backed by MedPy, with one empty-mask rule.

The overlap and surface-distance computations are MedPy's (``medpy.metric.binary``: ``dc``,
``jc``, ``hd95``, ``assd``); this module only decides what MedPy leaves undefined, which
is what happens when a structure is absent from the prediction or the ground truth:

* both empty (the part is absent and none is predicted): a perfect score, Dice = IoU = 1,
  HD95 = ASSD = 0;
* exactly one empty (a part is missed, or hallucinated): the worst score, Dice = IoU = 0,
  HD95 = ASSD = the image diagonal in pixels (the largest distance two pixels of the image
  can have), so a missed part can never look better than any detected one (``empty_rule:
  diagonal``, the default). ``empty_rule: feddp_pixel`` is FedDP's tester
  (``scripts/tester_utils.py:101-102``): an empty prediction of a part the ground truth holds
  gets one pixel at (0, 0) and MedPy scores the pair (Dice, IoU about 0; HD95, ASSD the distances
  from that corner); an empty ground truth with a prediction keeps the diagonal (FedDP has no rule).

Scores are computed per frame and per foreground class (classes 1..C-1; background is left
out of the averages as in the EndoVis part-segmentation protocol) and then averaged over
frames; ``mean_<metric>`` averages the per-class values. Distances are in pixels of the masks
compared (spacing 1), as the FedST paper reports them, or, given a frame's ``spacing`` (the native
frame's pixels per mask pixel, rows then columns), in pixels of the native frame (MedPy's
``voxelspacing``; the empty-mask distance is then the native diagonal).

``assd`` (how ASSD averages the two directions' surface distances): ``medpy_0_5`` (default, the
pinned ``medpy==0.5.2``, ``binary.py:470``: the mean of both directions' distances pooled, so the
contour with more border pixels weighs more) or ``medpy_0_4`` (MedPy 0.4.0, ``binary.py:453``: the
mean of the two directional means). HD95 is the same in both (the 95th percentile of both pooled).

``class_rule`` (which classes a frame's score covers): ``all_classes`` (default) scores every
foreground class in every frame with the rule above; ``gt_classes`` is the EndoVis 2017
convention (ternaus/robot-surgery-segmentation ``evaluate.py:10-41``): a frame's score is the
mean over the classes present in its ground truth, classes only predicted are ignored, and a
frame without any part scores perfect if nothing is predicted, else worst. ``mean_<metric>``
is then the mean of the frame scores; ``<metric>_<class>`` the mean over the frames whose
ground truth holds that class (NaN if none).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import numpy as np
from medpy.metric import binary as mb

from fedmedbench.metrics.scoring import (  # noqa: F401  (the names this module's callers read)
    ASSD_RULES,
    CLASS_RULES,
    EMPTY_RULES,
    HIGHER_IS_BETTER,
    METRICS,
    RESOLUTIONS,
    Spacing,
    check_empty_rule,
    empty_mask_scores,
    empty_penalty,
    sets_feddp_pixel,
)

#: MedPy's surface distances, the helper its ``hd95`` and ``assd`` each call twice (result -> reference and back):
#: one pair of them gives both metrics, the same numbers at half the distance transforms
_SURFACE_DISTANCES = getattr(mb, "__surface_distances", None)


def binary_scores(pred: np.ndarray, gt: np.ndarray, assd: str = "medpy_0_5", spacing: Spacing = None,
                  empty_rule: str = "diagonal") -> dict[str, float]:
    """Dice, IoU, HD95, ASSD of one binary mask pair, with the documented empty-mask rule."""
    pred = np.asarray(pred, dtype=bool)
    gt = np.asarray(gt, dtype=bool)
    if pred.shape != gt.shape:
        raise ValueError(f"prediction shape {pred.shape} != ground-truth shape {gt.shape}")
    if sets_feddp_pixel(empty_rule, bool(pred.any()), bool(gt.any())):
        pred = pred.copy()
        pred[(0,) * pred.ndim] = True
    empty = empty_mask_scores(bool(pred.any()), bool(gt.any()), pred.shape, spacing)
    if empty is not None:
        return empty
    return {"dice": float(mb.dc(pred, gt)), "iou": float(mb.jc(pred, gt)), **surface_scores(pred, gt, assd, spacing)}


def surface_scores(pred: np.ndarray, gt: np.ndarray, assd: str = "medpy_0_5", spacing: Spacing = None) -> dict[str, float]:
    """HD95 and ASSD of two non-empty masks as MedPy defines them (``binary.py``: ``hd95`` = the 95th
    percentile of both directions' surface distances stacked; ``assd`` by :data:`ASSD_RULES`), from one pair
    of them, computed on the box both masks lie in (:func:`box_around`): the same distances, in the same order."""
    if assd not in ASSD_RULES:
        raise ValueError(f"assd must be one of {ASSD_RULES}, got {assd!r}")
    if _SURFACE_DISTANCES is None:  # a MedPy without the helper: its own functions
        one, other = mb.asd(pred, gt, spacing), mb.asd(gt, pred, spacing)
        mean = float(mb.assd(pred, gt, spacing)) if assd == "medpy_0_5" else float(np.mean((one, other)))
        return {"hd95": float(mb.hd95(pred, gt, spacing)), "assd": mean}
    box = box_around(pred | gt)
    pred, gt = pred[box], gt[box]
    there, back = _SURFACE_DISTANCES(pred, gt, spacing, 1), _SURFACE_DISTANCES(gt, pred, spacing, 1)
    both = np.hstack((there, back))
    mean = both.mean() if assd == "medpy_0_5" else np.mean((there.mean(), back.mean()))
    return {"hd95": float(np.percentile(both, 95)), "assd": float(mean)}


def box_around(mask: np.ndarray) -> tuple[slice, ...]:
    """The smallest box holding every set pixel of a non-empty ``mask``. MedPy's surface distances on it are those
    on the whole image: its erosion takes what lies outside an array as empty, as the pixels around the box are;
    every border pixel lies in the box, so the nearest one to any pixel of the box is in it; and the border pixels
    keep their row-major order."""
    box = []
    for axis in range(mask.ndim):
        hit = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)))
        box.append(slice(int(hit[0]), int(hit[-1]) + 1))
    return tuple(box)


def native_spacing(mask_paths: Iterable[str], shape: tuple[int, int]) -> list[tuple[float, float]]:
    """Each mask file's native pixels per pixel of the ``shape`` (rows, columns) its frame is scored at
    (the file's header only: sizes from PIL, nothing decoded)."""
    from PIL import Image

    out = []
    for path in mask_paths:
        with Image.open(path) as im:
            width, height = im.size
        out.append((height / shape[0], width / shape[1]))
    return out


def native_masks(mask_paths: Iterable[str]) -> list[np.ndarray]:
    """The label maps of the mask files as stored (native size)."""
    from PIL import Image

    out = []
    for path in mask_paths:
        with Image.open(path) as im:
            out.append(np.asarray(im))
    return out


def frame_scores(pred: np.ndarray, gt: np.ndarray, classes: Iterable[int], assd: str = "medpy_0_5",
                 spacing: Spacing = None, empty_rule: str = "diagonal") -> dict[int, dict[str, float]]:
    """Per-class scores of one label map pair (``classes``: the label values to score)."""
    return {c: binary_scores(pred == c, gt == c, assd, spacing, empty_rule) for c in classes}


def gt_classes_frame(scores: dict[int, dict[str, float]], pred_any: Callable[[], bool], shape: tuple[int, ...],
                     spacing: Spacing = None) -> dict[str, float]:
    """A frame's score under ``gt_classes`` from the scores of the classes in its ground truth: their mean; a
    frame without any part scores perfect if no part is predicted either (``pred_any()``), else worst."""
    if scores:
        return {m: float(np.mean([s[m] for s in scores.values()])) for m in METRICS}
    return empty_mask_scores(pred_any(), False, shape, spacing)


class SegmentationMeter:
    """Accumulates per-frame, per-class scores; :meth:`result` averages over frames.

    ``class_names`` maps label value -> name for the foreground classes scored.
    ``binary=True`` collapses every non-zero label of prediction and ground truth into one
    foreground class (the unseen binary set: all parts = instrument). ``submit`` (an executor's
    ``submit``) scores frames in worker threads while the caller predicts the next ones (SciPy's
    distance transforms release the GIL); they are taken in the order added, so the averages are the
    same bits, and at most ``max_pending`` frames wait.
    """

    def __init__(self, class_names: dict[int, str], binary: bool = False, class_rule: str = "all_classes",
                 submit: Callable[..., Future] | None = None, max_pending: int = 64, assd: str = "medpy_0_5",
                 empty_rule: str = "diagonal") -> None:
        if class_rule not in CLASS_RULES:
            raise ValueError(f"class_rule must be one of {CLASS_RULES}, got {class_rule!r}")
        if assd not in ASSD_RULES:
            raise ValueError(f"assd must be one of {ASSD_RULES}, got {assd!r}")
        check_empty_rule(empty_rule)
        self.assd = assd
        self.empty_rule = empty_rule
        self.binary = binary
        self.class_rule = class_rule
        self.class_names = {1: "instrument"} if binary else dict(class_names)
        self._rows: list[dict[int, dict[str, float]]] = []
        self._frames: list[dict[str, float]] = []  # gt_classes: each frame's score
        self._submit = submit
        self._max_pending = max(1, int(max_pending))
        self._pending: deque[Future] = deque()

    def add(self, pred: np.ndarray, gt: np.ndarray, spacing: list[Spacing] | None = None) -> None:
        """One frame (2-D label maps) or a batch (N, H, W); ``spacing``: each frame's (None: pixels of the maps)."""
        pred, gt = np.asarray(pred), np.asarray(gt)
        if pred.ndim == 2:
            pred, gt = pred[None], gt[None]
        spacing = list(spacing) if spacing is not None else [None] * len(pred)
        for p, g, sp in zip(pred, gt, spacing, strict=True):
            if self._submit is None:
                self._keep(self._score(p, g, sp))
                continue
            while len(self._pending) >= self._max_pending:
                self._keep(self._pending.popleft().result())
            self._pending.append(self._submit(self._score, p, g, sp))

    def _score(self, p: np.ndarray, g: np.ndarray, sp: Spacing = None) -> tuple[dict[int, dict[str, float]], dict[str, float] | None]:
        """One frame's per-class scores, and under ``gt_classes`` its frame score."""
        if self.binary:
            p, g = (p > 0).astype(np.uint8), (g > 0).astype(np.uint8)
        if self.class_rule == "all_classes":
            return frame_scores(p, g, self.class_names, self.assd, sp, self.empty_rule), None
        present = [c for c in self.class_names if (g == c).any()]
        scores = frame_scores(p, g, present, self.assd, sp, self.empty_rule)
        return scores, gt_classes_frame(scores, lambda: bool(np.isin(p, list(self.class_names)).any()), g.shape, sp)

    def add_on_device(self, pred, gt, spacing: list[Spacing] | None = None) -> None:
        """A batch (N, H, W) of label-map tensors scored with torch where they are
        (:func:`fedmedbench.metrics.segmentation_device.batch_scores`): the scores of :meth:`add` within the tolerance
        that module states, the frames kept after those added before."""
        from fedmedbench.metrics.segmentation_device import batch_scores

        if self.binary:
            pred, gt = (pred > 0).byte(), (gt > 0).byte()
        self._drain()
        for frame in batch_scores(pred, gt, list(self.class_names), self.assd, spacing, empty_rule=self.empty_rule):
            if self.class_rule == "all_classes":
                self._keep((frame.scores, None))
                continue
            scores = {c: frame.scores[c] for c in self.class_names if frame.in_gt[c]}
            self._keep((scores, gt_classes_frame(scores, lambda f=frame: f.pred_any, frame.shape, frame.spacing)))

    def _keep(self, scored: tuple[dict[int, dict[str, float]], dict[str, float] | None]) -> None:
        self._rows.append(scored[0])
        if scored[1] is not None:
            self._frames.append(scored[1])

    def _drain(self) -> None:
        while self._pending:
            self._keep(self._pending.popleft().result())

    def __len__(self) -> int:
        self._drain()
        return len(self._rows)

    def result(self) -> dict[str, float]:
        """``<metric>_<class>`` per class and ``mean_<metric>`` (mean over classes); NaN if no frame."""
        self._drain()
        out: dict[str, float] = {}
        if self.class_rule == "gt_classes":
            for m in METRICS:
                for c, name in self.class_names.items():
                    vals = [r[c][m] for r in self._rows if c in r]
                    out[f"{m}_{name}"] = float(np.mean(vals)) if vals else math.nan
                out[f"mean_{m}"] = float(np.mean([f[m] for f in self._frames])) if self._frames else math.nan
            return out
        for m in METRICS:
            per_class = []
            for c, name in self.class_names.items():
                v = float(np.mean([r[c][m] for r in self._rows])) if self._rows else math.nan
                out[f"{m}_{name}"] = v
                per_class.append(v)
            out[f"mean_{m}"] = float(np.mean(per_class)) if self._rows else math.nan
        return out
