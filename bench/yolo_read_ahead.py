"""One UltraFlwr client's local training with its batches loaded as they are used (UltraFlwr's ``workers=0``)
and read ahead in a thread while the model trains (``engine.loader_workers >= 1``): seconds per epoch of each,
alternating, the faster of ``--repeats`` counted, and the final weights compared (they must be the same bits).
``--pixel-thread`` adds a third side: read ahead, with each sample's last pixel steps in one more thread
(:mod:`fedmedbench.fl.tasks.detection.pixel_thread`, ``train_yolo(pixel_thread=True)``).

    python bench/surgical_stand_in.py --config config/studies/ultraflwr.yaml --out /tmp/si-uf --fraction 0.02
    python bench/yolo_read_ahead.py --surgical-dir /tmp/si-uf --epochs 2 --repeats 2 [--pixel-thread]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402
from _surgical_cost import add_client_args, client_manifest, data_label, stand_in  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.tasks.detection.staging import read_manifest, stage_export  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_client_args(ap)
    ap.add_argument("--epochs", type=positive, default=2)
    ap.add_argument("--repeats", type=positive, default=2)
    ap.add_argument("--imgsz", type=positive, default=640)
    ap.add_argument("--batch", type=positive, default=8)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--threads", type=positive, default=1, help="torch threads of the training")
    ap.add_argument("--pixel-thread", action="store_true", help="also time read ahead with the pixel thread")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    limit_threads(args.threads)
    import torch

    from fedmedbench.fl.tasks.detection.yolo import build_yolo, train_yolo

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("yolo_read_ahead: --device cuda, but torch sees no CUDA device")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    manifest = client_manifest(args)
    classes = len(read_manifest(manifest)["classes"])
    sides = {"inline": {}, "read_ahead": {"read_ahead": True}}
    if args.pixel_thread:
        sides["read_ahead_pixel_thread"] = {"read_ahead": True, "pixel_thread": True}
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    weights: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stage = stage_export(manifest, Path(tmp) / "stage")
        data_yaml = stage / f"client_{args.client}" / "data.yaml"
        # untimed: the label caches written and the process's one-time costs paid before either side is timed
        train_yolo(build_yolo("yolo11n.yaml", classes, seed=0), data_yaml, epochs=1, batch=args.batch, imgsz=args.imgsz,
                   seed=0, device=device, workdir=Path(tmp) / "w", select="last")
        for _ in range(args.repeats):
            for side, opts in sides.items():
                model = build_yolo("yolo11n.yaml", classes, seed=0)
                t0 = time.perf_counter()
                out = train_yolo(model, data_yaml, epochs=args.epochs, batch=args.batch, imgsz=args.imgsz, seed=0,
                                 device=device, workdir=Path(tmp) / "w", select="last", **opts)
                seconds[side].append((time.perf_counter() - t0) / args.epochs)
                weights[side] = out.state
    same = all(torch.equal(weights["inline"][k], w[k]) for w in weights.values() for k in weights["inline"])
    if not same:
        raise SystemExit("yolo_read_ahead: the batches read ahead trained other weights than the inline ones")
    inline, ahead = min(seconds["inline"]), min(seconds["read_ahead"])
    extra = {}
    if args.pixel_thread:
        both = min(seconds["read_ahead_pixel_thread"])
        extra = {"read_ahead_pixel_thread_s_per_epoch": round(both, 3), "pixel_thread_speedup": round(ahead / both, 3)}
    emit([{"bench": "yolo_read_ahead", **data_label(stand_in(args.surgical_dir)), "group": args.group,
           "setting": args.setting, "client": args.client, "imgsz": args.imgsz, "batch": args.batch,
           "epochs": args.epochs, "device": str(device), "threads": args.threads,
           "inline_s_per_epoch": round(inline, 3), "read_ahead_s_per_epoch": round(ahead, 3),
           "speedup": round(inline / ahead, 3), **extra,
           "runs_s_per_epoch": {side: [round(x, 3) for x in runs] for side, runs in seconds.items()},
           "same_weights": same, "code": git_head()}], args.out)


if __name__ == "__main__":
    main()
