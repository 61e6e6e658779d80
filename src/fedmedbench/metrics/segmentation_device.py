"""Dice, IoU, HD95 and ASSD of a batch of label maps with torch, on the device the tensors are on.

The same scores as :mod:`fedmedbench.metrics.segmentation` (MedPy + the empty-mask rule), computed for every
frame and class of a batch at once, so a model evaluated on a GPU is scored there instead of one
mask pair at a time with SciPy on the CPU:

* Dice and IoU from the pixel counts, divided in Python as MedPy's ``dc`` / ``jc`` do: the same bits.
* Surface (border) pixels as MedPy's ``__surface_distances`` takes them: a mask minus its binary
  erosion by the cross (``generate_binary_structure(2, 1)``), pixels outside the image counting as
  empty (SciPy's ``border_value=0``).
* Each border pixel's distance to the nearest border pixel of the other mask, exact: per row of the
  other mask's border the column distance to its nearest pixel (running max / min of the border's
  column indices), then per query pixel the minimum over rows of ``(dy*sy)^2 + (dx*sx)^2`` in float64 —
  SciPy's distance transform evaluates the same expression for the nearest feature, so the
  squared distances are the same numbers, integer-exact at spacing 1.
* HD95: the 95th percentile of both directions' distances pooled, with NumPy's ``linear`` rule
  (virtual index ``(n-1)*0.95``, its ``_lerp``), found among the squared distances (the square root
  keeps their order) and only its two values rooted, by NumPy: torch's float64 ``sqrt`` on a CPU may
  round a bit off (``sqrt(149)``), NumPy's is correctly rounded as SciPy's is. ASSD by
  :data:`fedmedbench.metrics.segmentation.ASSD_RULES`, from torch's square roots: only the rounding of those and
  the summation order of its means differ from NumPy's (float64: within 1e-12 relative).

Every mask is scored on the box holding every set pixel of the batch (the argument of
:func:`fedmedbench.metrics.segmentation.box_around`, for all pairs at once), and the per-pixel work is done in
chunks of at most ``chunk`` float64 values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedmedbench.metrics.scoring import ASSD_RULES, Spacing, check_empty_rule, empty_mask_scores

#: how far (relative) ASSD may lie from MedPy's: its square roots are torch's and its sums are added in another
#: order; every other score is the same bits
ASSD_RTOL = 1e-12
#: largest number of float64 values one step of the nearest-border search holds (128 MiB)
CHUNK = 2**24
#: a column distance no image reaches: "no border pixel in this row"
_NONE = 2**28
#: the percentile HD95 takes, as ``np.percentile(.., 95)`` divides it
_Q = np.true_divide(95, 100)


@dataclass
class FrameScores:
    """One frame's scores: ``scores[c]`` = {dice, iou, hd95, assd} of class ``c``; ``in_gt[c]`` whether the
    ground truth holds ``c``; ``pred_any`` whether the prediction holds any scored class."""

    scores: dict[int, dict[str, float]]
    in_gt: dict[int, bool]
    pred_any: bool
    shape: tuple[int, int]
    spacing: Spacing


def borders(masks: torch.Tensor) -> torch.Tensor:
    """The 1-pixel border of each (.., H, W) bool mask: the mask minus its erosion by the 4-neighbour cross,
    the outside of the image taken as empty (MedPy's ``result ^ binary_erosion(result, footprint)``)."""
    padded = torch.nn.functional.pad(masks, (1, 1, 1, 1), value=False)
    eroded = (masks & padded[..., :-2, 1:-1] & padded[..., 2:, 1:-1] & padded[..., 1:-1, :-2] & padded[..., 1:-1, 2:])
    return masks & ~eroded


def _row_gaps(border: torch.Tensor) -> torch.Tensor:
    """Per pixel of (P, H, W) ``border`` masks, the column distance to the nearest border pixel of its own row
    (int32; :data:`_NONE` or more in a row without any)."""
    cols = torch.arange(border.shape[-1], device=border.device, dtype=torch.int32).expand_as(border)
    last = torch.where(border, cols, -_NONE).cummax(dim=-1).values
    nxt = torch.where(border, cols, 2 * _NONE).flip(-1).cummin(dim=-1).values.flip(-1)
    return torch.minimum(cols - last, nxt - cols)


def _distance(gaps: torch.Tensor) -> torch.Tensor:
    """Gaps as float64, those of rows without a border pixel infinite."""
    return torch.where(gaps >= _NONE, math.inf, gaps.to(torch.float64))


def nearest_border_squared_distances(query: torch.Tensor, other: torch.Tensor, spacing: torch.Tensor,
                                     chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """For every set pixel of the (P, H, W) ``query`` masks, in row-major order per mask, the squared Euclidean
    distance to the nearest set pixel of the same mask pair's ``other`` (each non-empty); ``spacing`` (P, 2): rows
    and columns per pixel. Returns (squared distances float64, the mask index of each).

    The nearest pixel is no farther than the nearest one in the query pixel's own row or column, so only the
    rows within that distance are searched: queries are grouped by that many rows, rounded up to a power of 2."""
    height = query.shape[1]
    across = _row_gaps(other).transpose(1, 2).contiguous()  # (P, W, H): column distance, per row, of a column
    down = _row_gaps(other.transpose(1, 2))  # (P, W, H): row distance in the same column
    pair, row, col = torch.nonzero(query, as_tuple=True)
    sy, sx = spacing[pair, 0], spacing[pair, 1]
    bound = torch.minimum(_distance(across[pair, col, row]) * sx, _distance(down[pair, col, row]) * sy)
    reach = torch.ceil(bound / sy).clamp(max=height) + 1  # rows either side that can hold the nearest pixel
    out = torch.empty(len(pair), dtype=torch.float64, device=query.device)
    done = torch.zeros(len(pair), dtype=torch.bool, device=query.device)
    width = 1
    while True:
        todo = torch.nonzero(~done & (reach <= width)).flatten() if width < height else torch.nonzero(~done).flatten()
        offsets = torch.arange(-width, width + 1, device=query.device)
        step = max(1, chunk // len(offsets))
        for s in range(0, len(todo), step):
            q = todo[s:s + step]
            p, r, c = pair[q], row[q], col[q]
            rows = r[:, None] + offsets[None, :]
            inside = (rows >= 0) & (rows < height)
            gap = _distance(across[p[:, None], c[:, None], rows.clamp(0, height - 1)]) * sx[q, None]
            dy = offsets[None, :].to(torch.float64) * sy[q, None]
            d2 = torch.where(inside, dy * dy + gap * gap, math.inf)
            out[q] = d2.min(dim=1).values
        done[todo] = True
        if width >= height:
            return out, pair
        width *= 2


def _percentile_picks(n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows of ``n`` sorted values, NumPy's ``percentile(.., 95)`` (method ``linear``): the two positions
    it interpolates between and the weight (``_get_indexes``: past the last value both are the last)."""
    virtual = (n - 1) * _Q
    below = np.floor(virtual)
    top = virtual >= n - 1
    lo = np.where(top, n - 1, below).astype(np.int64)
    hi = np.where(top, n - 1, below + 1).astype(np.int64)
    return lo, hi, virtual - below


def _lerp(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """NumPy's ``_lerp``: from ``a`` below a weight of 0.5, from ``b`` above, the same float64 steps."""
    diff = b - a
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)


def _padded(values: torch.Tensor, owner: torch.Tensor, groups: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` grouped by ``owner`` (sorted, 0..groups-1) into rows of a (groups, longest) matrix, the rest
    ``fill``; also each group's count."""
    counts = torch.bincount(owner, minlength=groups)
    width = int(counts.max()) if groups else 0
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(len(values), device=values.device) - starts[owner]
    out = torch.full((groups, max(width, 1)), fill, dtype=values.dtype, device=values.device)
    out[owner, pos] = values
    return out, counts


def surface_scores(pred: torch.Tensor, gt: torch.Tensor, spacing: torch.Tensor, assd: str = "medpy_0_5",
                   chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """HD95 and ASSD (float64 arrays) of each pair of non-empty (P, H, W) bool masks, as
    :func:`fedmedbench.metrics.segmentation.surface_scores`; ``spacing`` (P, 2) float64 (1 = pixels)."""
    if assd not in ASSD_RULES:
        raise ValueError(f"assd must be one of {ASSD_RULES}, got {assd!r}")
    n_pairs = pred.shape[0]
    if n_pairs == 0:
        return np.zeros(0), np.zeros(0)
    both = (pred | gt).any(dim=0)
    rows, cols = torch.nonzero(both.any(dim=1)).flatten(), torch.nonzero(both.any(dim=0)).flatten()
    r0, r1, c0, c1 = (int(v) for v in torch.stack((rows[0], rows[-1], cols[0], cols[-1])).tolist())
    pred, gt = pred[:, r0:r1 + 1, c0:c1 + 1], gt[:, r0:r1 + 1, c0:c1 + 1]
    pb, gb = borders(pred), borders(gt)
    # both directions at once: pairs 0..P-1 = prediction -> ground truth, P..2P-1 = back
    squared, owner = nearest_border_squared_distances(torch.cat((pb, gb)), torch.cat((gb, pb)),
                                                      torch.cat((spacing, spacing)), chunk)
    by_direction, counts = _padded(squared, owner, 2 * n_pairs, 0.0)
    sums = by_direction.sqrt().sum(dim=1)
    pooled = torch.cat((by_direction[:n_pairs], by_direction[n_pairs:]), dim=1)
    width = by_direction.shape[1]
    valid = torch.arange(width, device=squared.device)[None, :] < counts[:, None]
    valid = torch.cat((valid[:n_pairs], valid[n_pairs:]), dim=1)
    pooled = torch.where(valid, pooled, torch.tensor(math.inf, dtype=torch.float64, device=squared.device)).sort(dim=1).values
    n = counts[:n_pairs] + counts[n_pairs:]
    n_np = n.cpu().numpy()
    # only the two values each percentile needs come back
    lo, hi, gamma = _percentile_picks(n_np)
    picks = torch.as_tensor(np.stack((lo, hi), axis=1), device=squared.device)
    two = np.sqrt(pooled.gather(1, picks).cpu().numpy())
    hd95 = _lerp(two[:, 0], two[:, 1], gamma)
    sums_np, counts_np = sums.cpu().numpy(), counts.cpu().numpy()
    if assd == "medpy_0_5":
        mean = (sums_np[:n_pairs] + sums_np[n_pairs:]) / n_np
    else:
        mean = (sums_np[:n_pairs] / counts_np[:n_pairs] + sums_np[n_pairs:] / counts_np[n_pairs:]) / 2
    return hd95, mean


def batch_scores(pred: torch.Tensor, gt: torch.Tensor, classes: Sequence[int], assd: str = "medpy_0_5",
                 spacing: Sequence[Spacing] | None = None, chunk: int = CHUNK, empty_rule: str = "diagonal") -> list[FrameScores]:
    """Per frame of the (N, H, W) label maps ``pred`` / ``gt`` (same device), the scores of every class in
    ``classes`` with :mod:`fedmedbench.metrics.segmentation`' empty-mask rule (``empty_rule``); ``spacing``: each
    frame's (None: pixels)."""
    check_empty_rule(empty_rule)
    if pred.shape != gt.shape or pred.ndim != 3:
        raise ValueError(f"prediction {tuple(pred.shape)} and ground truth {tuple(gt.shape)} must be the same (N, H, W)")
    if assd not in ASSD_RULES:
        raise ValueError(f"assd must be one of {ASSD_RULES}, got {assd!r}")
    n, h, w = pred.shape
    spacing = list(spacing) if spacing is not None else [None] * n
    if len(spacing) != n:
        raise ValueError(f"{len(spacing)} spacings for {n} frames")
    classes = [int(c) for c in classes]
    labels = torch.as_tensor(classes, device=pred.device, dtype=pred.dtype).view(1, -1, 1, 1)
    p = (pred[:, None] == labels).reshape(n * len(classes), h, w)
    g = (gt[:, None] == labels.to(gt.dtype)).reshape(n * len(classes), h, w)
    if empty_rule == "feddp_pixel":  # an empty prediction of a part the ground truth holds: one pixel at (0, 0)
        # (never in a frame whose ground truth holds no part, the one ``pred_any`` below is read for)
        miss = ~p.flatten(1).any(dim=1) & g.flatten(1).any(dim=1)
        p[:, 0, 0] |= miss
    counts = torch.stack((p.sum(dim=(1, 2)), g.sum(dim=(1, 2)), (p & g).sum(dim=(1, 2)), (p | g).sum(dim=(1, 2))), dim=1)
    counts_np = counts.cpu().numpy().tolist()
    both = [i for i, (a, b, _, _) in enumerate(counts_np) if a and b]
    steps = torch.tensor([[1.0, 1.0] if s is None else [float(v) for v in s] for s in spacing], dtype=torch.float64,
                         device=pred.device)
    pick = torch.as_tensor(both, dtype=torch.long, device=pred.device)
    hd95, mean = surface_scores(p[pick], g[pick], steps[pick // len(classes)], assd, chunk) if both else ([], [])
    surface = {i: (float(a), float(b)) for i, a, b in zip(both, hd95, mean, strict=True)}
    out = []
    for f in range(n):
        scores, in_gt = {}, {}
        for k, c in enumerate(classes):
            i = f * len(classes) + k
            size_p, size_g, inter, union = counts_np[i]
            in_gt[c] = bool(size_g)
            empty = empty_mask_scores(bool(size_p), bool(size_g), (h, w), spacing[f])
            if empty is not None:
                scores[c] = empty
            else:
                scores[c] = {"dice": 2.0 * inter / float(size_p + size_g), "iou": float(inter) / float(union),
                             "hd95": surface[i][0], "assd": surface[i][1]}
        pred_any = any(counts_np[f * len(classes) + k][0] for k in range(len(classes)))
        out.append(FrameScores(scores, in_gt, pred_any, (h, w), spacing[f]))
    return out
