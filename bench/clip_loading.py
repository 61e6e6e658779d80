"""FedST's data path per local step: a training batch of clips decoded, resized and augmented, as
``train_steps`` takes it (2 clips of 4 frames at the study's 480x480), with 0 or more decode threads
(``engine.loader_workers``) and a cold cache (every clip decoded: the paper grid's 7,056 training
clips at 480x480 are about 21 GB, the cache 4 GB). ``--compute-ms`` stands for the model's step on a
GPU: the loop waits that long after taking each batch, so the threads decode while it "trains"; a step
then costs max(compute, data not hidden). ``--metrics`` also times the evaluation's scores of a frame
(Dice, IoU, HD95, ASSD of every part, on the CPU) on the site's test masks against the masks shifted 5 px,
in as many threads. ``--server SITE`` also times FedST's server steps (SERQ's synthetic batches) on that
site's clips. ``--image-cache DIR`` times each site twice with the decoded clips kept in DIR
(``engine.image_cache``): once writing them (a cold store), once reading them back (what every later
step, round and job reads).

    python bench/clip_loading.py --clips /tmp/fedmedbench-stand-in/fedst/clips --site A C --steps 40 \
        --workers 0 2 4 --compute-ms 0 60 [--out bench/results.jsonl]

The clips are a stand-in's (``surgical_stand_in.py``) or the pipeline's export of the real videos.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import positive  # noqa: E402
from _report import emit  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.tasks.segmentation import FrameCache, augment, load_clipset  # noqa: E402
from fedmedbench.metrics.segmentation import SegmentationMeter  # noqa: E402


def time_site(clips: Path, site: str, steps: int, workers: int, compute_ms: float, size: tuple[int, int],
              batch: int = 2, frames: int = 4, disk: Path | None = None) -> dict:
    data = load_clipset(clips, site, "train", frames, size, FrameCache(0, workers, disk))
    if len(data) < batch:
        raise SystemExit(f"{clips}: site {site} has {len(data)} training clips, fewer than a batch of {batch}")
    distinct = sum(len(set(p)) for p in data.clip_paths) / len(data)
    g = torch.Generator().manual_seed(0)
    order: list[int] = []
    ahead = max(batch, workers)
    t0, c0 = time.perf_counter(), time.process_time()
    reading = augmenting = 0.0
    for step in range(steps):
        if len(order) < batch:  # reshuffled as train_steps does
            order += torch.randperm(len(data), generator=g).tolist()
        idx, order = order[:batch], order[batch:]
        t1 = time.perf_counter()
        x, y = data.batch(idx, ahead=order[:min(ahead, batch * (steps - step - 1))])
        t2 = time.perf_counter()
        augment(x, y, g, 15.0, 0.1)  # on the CPU here; on the model's device in training
        reading, augmenting = reading + t2 - t1, augmenting + time.perf_counter() - t2
        time.sleep(compute_ms / 1000)
    per_step = (time.perf_counter() - t0) / steps
    cpu_per_step = (time.process_time() - c0) / steps  # every thread's: the work, apart from waiting on a shared machine
    return {"bench": "clip_loading", "site": site, "clips": len(data), "distinct_frames_per_clip": round(distinct, 2),
            "input_size": list(size), "batch": batch, "steps": steps, "loader_workers": workers,
            "compute_ms": compute_ms, "image_cache": disk is not None, "ms_per_step": round(per_step * 1000, 1),
            "cpu_ms_per_step": round(cpu_per_step * 1000, 1),
            "batch_ms_per_step": round(reading / steps * 1000, 1), "augment_ms_per_step": round(augmenting / steps * 1000, 1),
            "data_ms_not_hidden": round(max(0.0, per_step * 1000 - compute_ms), 1)}


def time_server(clips: Path, site: str, steps: int, workers: int, compute_ms: float, size: tuple[int, int],
                batch: int = 2, frames: int = 4) -> dict:
    """FedST's server steps (SERQ, Fig. 5's fine-tuning): ``synthetic_batches`` on the server site's clips (random
    clips a step, augmented), from a cold cache, waiting ``compute_ms`` after each batch as :func:`time_site`."""
    from fedmedbench.fl.methods.fedst import synthetic_batches

    data = load_clipset(clips, site, None, frames, size, FrameCache(0, workers))
    if len(data) < batch:
        raise SystemExit(f"{clips}: site {site} has {len(data)} clips, fewer than a batch of {batch}")
    cfg = {"batch_size": batch, "steps": steps, "loss": {"augment": True, "rotate_deg": 15, "scale": 0.1}}
    reading = 0.0
    take = data.batch

    def timed_batch(idx, ahead=()):  # the batch alone, apart from its augmentation
        nonlocal reading
        t = time.perf_counter()
        out = take(idx, ahead)
        reading += time.perf_counter() - t
        return out

    data.batch = timed_batch
    batches = synthetic_batches(data, cfg, torch.Generator().manual_seed(0), torch.device("cpu"))
    t0 = time.perf_counter()
    taking = 0.0
    for _ in range(steps):
        t1 = time.perf_counter()
        next(batches)
        taking += time.perf_counter() - t1
        time.sleep(compute_ms / 1000)
    per_step = (time.perf_counter() - t0) / steps
    return {"bench": "clip_loading", "server_site": site, "clips": len(data), "input_size": list(size), "batch": batch,
            "steps": steps, "loader_workers": workers, "compute_ms": compute_ms, "ms_per_step": round(per_step * 1000, 1),
            "batch_ms_per_step": round(reading / steps * 1000, 1),
            "augment_ms_per_step": round((taking - reading) / steps * 1000, 1),
            "data_ms_not_hidden": round(max(0.0, per_step * 1000 - compute_ms), 1)}


def time_metrics(clips: Path, site: str, size: tuple[int, int], workers: int, frames: int = 20) -> dict:
    """The evaluation's meter on ``frames`` test masks against them shifted 5 px, 8 frames a batch, scored in
    ``workers`` threads (``engine.loader_workers``) or in the caller's."""
    data = load_clipset(clips, site, "test", 4, size, FrameCache(0))
    if len(data) == 0:
        raise SystemExit(f"{clips}: site {site} has no test clips to score")
    masks = np.stack([data.item(i)[1].numpy() for i in range(min(frames, len(data)))])
    parts = {int(v): str(v) for v in np.unique(masks) if v > 0}
    with ThreadPoolExecutor(workers) if workers else nullcontext() as pool:
        meter = SegmentationMeter(parts, submit=pool.submit if pool else None, max_pending=max(8, 4 * workers))
        t0 = time.perf_counter()
        for start in range(0, len(masks), 8):
            meter.add(np.roll(masks[start:start + 8], 5, axis=2), masks[start:start + 8])
        meter.result()
        per_frame = (time.perf_counter() - t0) / len(masks)
    return {"bench": "seg_metrics", "site": site, "input_size": list(size), "frames": len(masks), "parts": len(parts),
            "loader_workers": workers, "ms_per_frame": round(per_frame * 1000, 1)}


def check_args(args: argparse.Namespace) -> None:
    """Exit with one line, before anything is timed, on a site without clips or a negative thread count or wait
    (else a traceback part way through, the rows timed so far lost), or on --image-cache or --metrics with no --site
    (they would time nothing)."""
    if min(args.workers) < 0:
        sys.exit(f"clip_loading: --workers {min(args.workers)}: give 0 (decode in the loop) or more threads")
    if min(args.compute_ms) < 0:
        sys.exit(f"clip_loading: --compute-ms {min(args.compute_ms):g}: give 0 or more milliseconds")
    idle = [flag for flag, given in (("--image-cache", args.image_cache), ("--metrics", args.metrics)) if given]
    if idle and not args.site:  # both time the --site sites only (the server's clips are timed cold)
        sys.exit(f"clip_loading: {' and '.join(idle)} {'times' if len(idle) == 1 else 'time'} the --site sites, "
                 "and none is given")
    for option, site in [*(("--site", s) for s in args.site), *([("--server", args.server)] if args.server else [])]:
        if not (args.clips / site / "clips.parquet").is_file():
            sites = sorted(p.parent.name for p in args.clips.glob("*/clips.parquet"))
            sys.exit(f"clip_loading: {option} {site}: no {args.clips}/{site}/clips.parquet (--clips holds "
                     f"{', '.join(sites) if sites else 'no sites'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=Path, required=True, help="a clips folder (sites.json, <site>/clips.parquet)")
    ap.add_argument("--site", nargs="*", default=["A", "C"], help="sites whose training steps to time (none: --site alone)")
    ap.add_argument("--steps", type=positive, default=40)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    ap.add_argument("--compute-ms", type=float, nargs="+", default=[0.0])
    ap.add_argument("--size", type=positive, nargs=2, default=[480, 480])
    ap.add_argument("--threads", type=positive, default=2, help="torch threads (the job's)")
    ap.add_argument("--metrics", action="store_true", help="also time the evaluation's per-frame scores")
    ap.add_argument("--image-cache", type=Path, help="also time the steps writing, then reading, decoded clips here")
    ap.add_argument("--server", metavar="SITE", help="also time the server's SERQ batches on this site's clips (sim)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    check_args(args)
    limit_threads(args.threads)
    rows = [time_site(args.clips, site, args.steps, w, c, tuple(args.size))
            for site in args.site for c in args.compute_ms for w in args.workers]
    if args.image_cache:
        for site in args.site:
            for c in args.compute_ms:
                for w in args.workers:
                    store = args.image_cache / f"{site}-{w}-{c:g}"  # each timing from a cold store
                    for phase in ("write", "read"):
                        rows.append({**time_site(args.clips, site, args.steps, w, c, tuple(args.size), disk=store),
                                     "image_cache": phase})
    if args.server:
        rows += [time_server(args.clips, args.server, args.steps, w, c, tuple(args.size))
                 for c in args.compute_ms for w in args.workers]
    if args.metrics:
        rows += [time_metrics(args.clips, site, tuple(args.size), w) for site in args.site for w in args.workers]
    emit(rows, args.out)


if __name__ == "__main__":
    main()
