"""Per-frame milliseconds of fedst's frame scoring (Dice, IoU, HD95, ASSD of 3 foreground classes), both ways.

* ``numpy``: :meth:`fedmedbench.metrics.segmentation.SegmentationMeter.add`, MedPy/SciPy on the CPU one frame after
  another (the evaluation spreads it over ``engine.loader_workers`` threads; one here);
* ``torch``: :meth:`~fedmedbench.metrics.segmentation.SegmentationMeter.add_on_device`, a batch at a time with torch on
  ``--device`` (``eval.metrics_device``), label maps already there (where the model's argmax leaves them).

The frames are synthetic 480x480 4-class label maps: smooth random blobs as ground truth and, as prediction,
the same blobs moved by a few pixels with some label noise (``--noise``: the share of pixels relabelled at
random, as an early model's scattered predictions). The bench also checks that the two meters' results agree
(``max_rel_diff``). It runs on the CPU here; the GPU figure is taken with ``bench/gpu_session.sh`` (its
``segmetrics on the device`` step).

    python bench/segmetrics_device.py --frames 16 --device cpu
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _cli import check_cuda, positive  # noqa: E402
from _report import emit, git_head  # noqa: E402
from scipy.ndimage import shift, zoom  # noqa: E402

from fedmedbench.metrics.segmentation import ASSD_RULES, SegmentationMeter  # noqa: E402
from fedmedbench.metrics.segmentation_device import ASSD_RTOL  # noqa: E402

CLASSES = {1: "shaft", 2: "wrist", 3: "clasper"}


def frames(n: int, size: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (ground truth, prediction) label-map pairs of ``size`` x ``size`` pixels, labels 0..3."""
    rng = np.random.default_rng(seed)
    gts, preds = [], []
    for _ in range(n):
        field = zoom(rng.random((size // 32, size // 32)), 32, order=1)
        gt = np.digitize(field, [0.55, 0.7, 0.85])
        pred = np.digitize(shift(field, rng.integers(-6, 7, 2), order=0, mode="nearest"), [0.55, 0.7, 0.85])
        flip = rng.random(pred.shape) < noise
        pred[flip] = rng.integers(0, 4, int(flip.sum()))
        gts.append(gt)
        preds.append(pred)
    return np.stack(gts).astype(np.uint8), np.stack(preds).astype(np.int64)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_numpy(pred: np.ndarray, gt: np.ndarray, assd: str) -> tuple[float, dict[str, float]]:
    meter = SegmentationMeter(CLASSES, assd=assd)
    t0 = time.perf_counter()
    for p, g in zip(pred, gt, strict=True):
        meter.add(p, g)
    result = meter.result()
    return (time.perf_counter() - t0) / len(pred), result


def time_torch(pred: np.ndarray, gt: np.ndarray, assd: str, device: torch.device, batch: int,
               repeats: int) -> tuple[float, dict[str, float]]:
    p, g = torch.as_tensor(pred, device=device), torch.as_tensor(gt, device=device)
    best, result = math.inf, {}
    for _ in range(repeats + 1):  # the first is a warm-up (kernels loaded, memory pooled)
        meter = SegmentationMeter(CLASSES, assd=assd)
        sync(device)
        t0 = time.perf_counter()
        for s in range(0, len(p), batch):
            meter.add_on_device(p[s:s + batch], g[s:s + batch])
        result = meter.result()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best / len(pred), result


def max_rel_diff(a: dict[str, float], b: dict[str, float]) -> float:
    return max(0.0 if a[k] == b[k] else abs(a[k] - b[k]) / max(abs(b[k]), 1e-300) for k in b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=positive, default=32)
    ap.add_argument("--size", type=positive, default=480, help="frame side in pixels, a multiple of 32 (the blobs' grid)")
    ap.add_argument("--batch", type=positive, default=8, help="frames per torch call (fedst eval.batch_size)")
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--assd", default="medpy_0_5", choices=ASSD_RULES)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=positive, default=3, help="timed torch passes (the best is kept)")
    ap.add_argument("--numpy-frames", type=positive, default=None, help="frames the NumPy path scores (default all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    check_cuda("segmetrics_device", args.device)
    if args.size % 32:  # frames() draws its blobs on a grid of size // 32 cells of 32 px: another side is not drawn
        ap.error(f"argument --size: {args.size}: give a multiple of 32")
    if not 0 <= args.noise <= 1:  # a share of the pixels: below 0 relabels none, above 1 all, the row naming another
        ap.error(f"argument --noise: {args.noise:g}: give a share of the pixels from 0 to 1")
    if args.numpy_frames and args.numpy_frames > args.frames:  # the row would claim more frames scored than were
        ap.error(f"argument --numpy-frames: {args.numpy_frames}: give at most --frames ({args.frames})")
    device = torch.device(args.device)
    gt, pred = frames(args.frames, args.size, args.noise, args.seed)
    k = args.numpy_frames or args.frames
    numpy_s, numpy_result = time_numpy(pred[:k], gt[:k], args.assd)
    torch_s, torch_result = time_torch(pred, gt, args.assd, device, args.batch, args.repeats)
    _, check = time_torch(pred[:k], gt[:k], args.assd, device, args.batch, 0)
    diff = max_rel_diff(check, numpy_result)
    print(f"numpy_ms_per_frame: {numpy_s * 1e3:.2f}")
    print(f"torch_ms_per_frame: {torch_s * 1e3:.2f} ({device})")
    print(f"max_rel_diff: {diff:.2e}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    emit([{"bench": "segmetrics_device", "device": name, "commit": git_head(), "size": args.size,
           "frames": args.frames, "numpy_frames": k, "batch": args.batch, "noise": args.noise, "assd": args.assd,
           "numpy_ms_per_frame": round(numpy_s * 1e3, 2), "torch_ms_per_frame": round(torch_s * 1e3, 3),
           "speedup": round(numpy_s / torch_s, 1), "max_rel_diff": diff}], args.out)
    if diff > ASSD_RTOL:
        sys.exit(f"segmetrics_device: the torch scores differ from NumPy's by {diff:.2e} (relative), "
                 f"more than the stated {ASSD_RTOL:g}")


if __name__ == "__main__":
    main()
