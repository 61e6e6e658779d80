"""What loading a YOLO training sample costs in the job's process (UltraFlwr's ``workers=0``), and what the
frame cache (``engine.image_cache``) saves: Ultralytics' training samples (mosaic and augmentation, seeded, the
study's HSV step) of one client, drawn three ways: every frame decoded and resized as it is read (no cache),
the frames read from full-size ``.npy`` files (Ultralytics' own ``cache='disk'`` files) and the frames read
stored at the training size (what ``engine.image_cache`` stores: :mod:`fedmedbench.fl.tasks.detection.sized_frames`),
and those with the last pixel steps in a second thread (:mod:`fedmedbench.fl.tasks.detection.pixel_thread`:
``engine.pixel_thread``, on in training by default). Samples are taken as the loader takes them, 8 a batch, each batch put
together by the dataset's ``collate_fn``. Every draw must give the same batches (checked); the row gives ms per
sample and images per second of each, the part spent reading frames, the caches' bytes per frame and the
seconds each took to write.

    python bench/surgical_stand_in.py --config config/studies/ultraflwr.yaml --out /tmp/si-uf --fraction 0.02
    python bench/yolo_loading.py --surgical-dir /tmp/si-uf --group combined --setting a --samples 96 --repeats 2
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402
from _surgical_cost import add_client_args, client_manifest, data_label, stand_in  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.tasks.detection import frame_cache as FC  # noqa: E402
from fedmedbench.fl.tasks.detection.pixel_thread import use_pixel_thread  # noqa: E402
from fedmedbench.fl.tasks.detection.sized_frames import read_sized_frames  # noqa: E402
from fedmedbench.fl.tasks.detection.staging import stage_export  # noqa: E402
from fedmedbench.fl.tasks.detection.yolo import _use_83_hsv  # noqa: E402

SIDES = ("decoded", "npy", "sized", "sized_thread")
#: samples a batch (UltraFlwr's)
BATCH = 8


def draw(images: Path, samples: int, imgsz: int, pixel_thread: bool = False) -> tuple[list, float, float, float]:
    """(batches' images, seconds, seconds reading frames, CPU seconds of the process's threads) of the study's training dataset on ``images``
    (Ultralytics' with 8.3.48's HSV step, reading the frames stored at ``imgsz`` where the stage links them, the
    last pixel steps in a second thread with ``pixel_thread``)."""
    import ultralytics.data.base as base
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(str(images.parents[1] / "data.yaml"))
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": 8, "workers": 0, "seed": 0, "deterministic": True})
    dataset = build_yolo_dataset(cfg, str(images), BATCH, data, mode="train")
    read_sized_frames(dataset)
    _use_83_hsv(dataset)
    if pixel_thread and not use_pixel_thread(dataset):
        raise SystemExit("the training set's transforms do not end as pixel_thread expects")
    reading = [0.0]

    def timed(fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                reading[0] += time.perf_counter() - t0
        return inner

    import fedmedbench.fl.tasks.detection.sized_frames as sized

    real_imread, real_load = base.imread, base.np.load
    base.imread, base.np.load = timed(real_imread), timed(real_load)
    sized.np.load = base.np.load  # the same numpy module: both loaders' reads are timed
    try:
        random.seed(0)
        np.random.seed(0)
        t0, c0 = time.perf_counter(), time.process_time()
        out = [dataset.collate_fn([dataset[i % len(dataset)] for i in range(b, min(samples, b + BATCH))])["img"]
               for b in range(0, samples, BATCH)]
        return out, time.perf_counter() - t0, reading[0], time.process_time() - c0
    finally:
        base.imread, base.np.load = real_imread, real_load
        sized.np.load = real_load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_client_args(ap)
    ap.add_argument("--samples", type=positive, default=96)
    ap.add_argument("--imgsz", type=positive, default=640)
    ap.add_argument("--threads", type=positive, default=1, help="torch threads, and threads writing the cache")
    ap.add_argument("--repeats", type=positive, default=1, help="draws of each side, alternating; the fastest counted")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    limit_threads(args.threads)
    manifest = client_manifest(args)
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    reads: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}  # on a shared machine: the work, apart from waiting
    drawn: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="fmb-yolo-") as tmp:
        images = {side: stage_export(manifest, Path(tmp) / side) / f"client_{args.client}" / "train" / "images"
                  for side in SIDES[:3]}
        images["sized_thread"] = images["sized"]
        reports, write_s = {}, {}
        for side, imgsz in (("npy", None), ("sized", args.imgsz)):
            t0 = time.perf_counter()
            reports[side] = FC.link_cached_frames([images[side]], Path(tmp) / f"frames-{side}", workers=args.threads,
                                                  log=lambda m: None, imgsz=imgsz)
            write_s[side] = time.perf_counter() - t0
        for _ in range(args.repeats):
            for side in SIDES:
                drawn[side], s, r, c = draw(images[side], args.samples, args.imgsz, side == "sized_thread")
                seconds[side].append(s)
                cpu[side].append(c)
                reads[side].append(r)
    same = all(all(bool((x == y).all()) for x, y in zip(drawn["decoded"], drawn[side], strict=True))
               for side in SIDES[1:])
    n = sum(len(b) for b in drawn["decoded"])
    best = {side: min(seconds[side]) for side in SIDES}
    read = {side: reads[side][seconds[side].index(best[side])] for side in SIDES}
    row = {"bench": "yolo_loading", **data_label(stand_in(args.surgical_dir)), "group": args.group,
           "setting": args.setting, "client": args.client, "imgsz": args.imgsz, "samples": n,
           "frames": reports["npy"].decoded, "repeats": args.repeats,
           "decoded_ms_per_sample": round(1000 * best["decoded"] / n, 2),
           "decode_ms_per_sample": round(1000 * read["decoded"] / n, 2),
           "cached_ms_per_sample": round(1000 * best["npy"] / n, 2),
           "npy_read_ms_per_sample": round(1000 * read["npy"] / n, 2),
           "sized_ms_per_sample": round(1000 * best["sized"] / n, 2),
           "sized_read_ms_per_sample": round(1000 * read["sized"] / n, 2),
           "sized_thread_ms_per_sample": round(1000 * best["sized_thread"] / n, 2),
           "images_per_s": {side: round(n / best[side], 1) for side in SIDES},
           "speedup": round(best["decoded"] / best["npy"], 2), "sized_speedup": round(best["decoded"] / best["sized"], 2),
           "sized_thread_speedup": round(best["decoded"] / best["sized_thread"], 2),
           "cache_bytes_per_frame": round(reports["npy"].bytes_written / max(1, reports["npy"].decoded)),
           "sized_bytes_per_frame": round(reports["sized"].bytes_written / max(1, reports["sized"].decoded)),
           "cache_write_s": round(write_s["npy"], 2), "sized_write_s": round(write_s["sized"], 2),
           "cpu_ms_per_sample": {side: round(1000 * min(cpu[side]) / n, 2) for side in SIDES},
           "threads": args.threads, "runs_s": {side: [round(t, 3) for t in seconds[side]] for side in SIDES},
           "same_samples": same, "code": git_head()}
    emit([row], args.out)
    if not same:
        sys.exit("the cached frames gave other samples than decoding: the comparison is not like for like")


if __name__ == "__main__":
    main()
