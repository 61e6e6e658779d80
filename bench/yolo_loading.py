"""What loading a YOLO training sample costs in the job's process (UltraFlwr's ``workers=0``), and what the
frame cache (``engine.image_cache``) saves: Ultralytics' training samples (mosaic and augmentation, seeded)
of one client, drawn with every frame decoded as it is read and with the frames read from the shared
``.npy`` files. Both draws must give the same samples (checked); the row gives ms per sample, the part
spent decoding (or reading the .npy), the cache's bytes per frame and the seconds it took to write.

    python bench/surgical_stand_in.py --config config/studies/ultraflwr.yaml --out /tmp/si-uf --fraction 0.02
    python bench/yolo_loading.py --surgical-dir /tmp/si-uf --group combined --setting a --samples 96
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

from _report import emit  # noqa: E402
from _surgical_cost import add_client_args, client_manifest, data_label, stand_in  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.tasks.detection import frame_cache as FC  # noqa: E402
from fedmedbench.fl.tasks.detection.staging import stage_export  # noqa: E402


def draw(images: Path, samples: int, imgsz: int) -> tuple[list, float, float]:
    """(samples, seconds, seconds reading frames) of Ultralytics' training dataset on ``images``."""
    import ultralytics.data.base as base
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(str(images.parents[1] / "data.yaml"))
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": 8, "workers": 0, "seed": 0, "deterministic": True})
    dataset = build_yolo_dataset(cfg, str(images), 8, data, mode="train")
    reading = [0.0]

    def timed(fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                reading[0] += time.perf_counter() - t0
        return inner

    real_imread, real_load = base.imread, base.np.load
    base.imread, base.np.load = timed(real_imread), timed(real_load)
    try:
        random.seed(0)
        np.random.seed(0)
        t0 = time.perf_counter()
        out = [dataset[i % len(dataset)]["img"] for i in range(samples)]
        return out, time.perf_counter() - t0, reading[0]
    finally:
        base.imread, base.np.load = real_imread, real_load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_client_args(ap)
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, and threads writing the cache")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    limit_threads(args.threads)
    manifest = client_manifest(args)
    with tempfile.TemporaryDirectory(prefix="fmb-yolo-") as tmp:
        plain = stage_export(manifest, Path(tmp) / "plain") / f"client_{args.client}" / "train" / "images"
        cached = stage_export(manifest, Path(tmp) / "cached") / f"client_{args.client}" / "train" / "images"
        t0 = time.perf_counter()
        report = FC.link_cached_frames([cached], Path(tmp) / "frames", workers=args.threads, log=lambda m: None)
        write_s = time.perf_counter() - t0
        a, plain_s, plain_read = draw(plain, args.samples, args.imgsz)
        b, cached_s, cached_read = draw(cached, args.samples, args.imgsz)
    same = all(bool((x == y).all()) for x, y in zip(a, b, strict=True))
    n = len(a)
    row = {"bench": "yolo_loading", **data_label(stand_in(args.surgical_dir)), "group": args.group,
           "setting": args.setting, "client": args.client, "imgsz": args.imgsz, "samples": n, "frames": report.decoded,
           "decoded_ms_per_sample": round(1000 * plain_s / n, 2), "decode_ms_per_sample": round(1000 * plain_read / n, 2),
           "cached_ms_per_sample": round(1000 * cached_s / n, 2), "npy_read_ms_per_sample": round(1000 * cached_read / n, 2),
           "speedup": round(plain_s / cached_s, 2), "cache_bytes_per_frame": round(report.bytes_written / max(1, report.decoded)),
           "cache_write_s": round(write_s, 2), "threads": args.threads, "same_samples": same}
    emit([row], args.out)
    if not same:
        sys.exit("the cached frames gave other samples than decoding: the comparison is not like for like")


if __name__ == "__main__":
    main()
