"""The ATen ops of one YOLO11n training step at batch 8 and the set-up of a local training (UltraFlwr's workload),
counted on the CPU: a proxy of the host cost a GPU waits on, where each op is one or more kernel launches.

One local training of the study (``train_yolo``, the paper grid's trainer options, ``workers=0``) on a synthetic
client (``--frames`` frames of ``--imgsz`` px, 1-3 boxes each, 7 classes as the study's data), counted with
``host_overhead.CountOps`` (non-view ops). A step is the ops from the end of one batch to the end of the next: the
batch's loading (``data``), the forward pass, the loss with its target assignment (``loss``, ``assigner`` inside),
the backward pass, the optimizer step (gradient clipping, AdamW, zeroing) and the EMA update; early in the warm-up
every batch takes an optimizer step, as counted here (after it one in ``64 / batch`` = 8 batches does). The first
batch (first use) is left out; the steps after it are equal in count (checked). Host syncs (ops whose result the host
reads, or whose output size depends on values: ``item``, ``nonzero``, ...) are counted apart: on a GPU each waits for
the device to finish. The set-up is what comes before the first batch: the trainer, the data sets and loaders, the
optimizer, the EMA and the validator, in ops and CPU seconds, of a process's second local training (its first also
imports). As on a GPU (``--as-on-a-gpu``, the default): AdamW fused and the gradient clipping on ``_foreach`` ops, as
the installed Ultralytics and PyTorch choose for CUDA tensors (on CPU tensors they loop over the tensors). The op
counts do not depend on ``--imgsz`` (the same tensors, smaller).

    python bench/yolo_step_ops.py [--imgsz 64] [--out bench/results.jsonl]

The last line printed is ``ops_per_step: N``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402
from host_overhead import CountOps, Phases  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402

#: the phases of a step, in the order they run (``other``: the trainer's own per-batch work)
STEP_PHASES = ("data", "forward", "loss", "assigner", "backward", "optimizer", "ema", "other")
#: UltraFlwr's batch and the study's class count
BATCH, CLASSES = 8, 7
#: ops after which the host waits for the device (a value read back, or an output sized by values)
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::_unique2", "aten::unique_consecutive",
            "aten::unique_dim", "aten::masked_select", "aten::repeat_interleave")


class CountSyncs(CountOps):
    """``CountOps`` that also counts, per phase, the ops in :data:`SYNC_OPS` (as ``<phase>_sync``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNC_OPS:
            self.phases.ops[f"{self.phases.stack[-1]}_sync"] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def as_on_a_gpu() -> Callable[[], None]:
    """The optimizer step as on CUDA tensors: AdamW fused (the installed Ultralytics' choice there) and the
    gradient clipping on ``_foreach`` ops (PyTorch's default there). The undo."""
    import functools

    import torch
    from torch.utils import _foreach_utils

    devices, adamw = _foreach_utils._get_foreach_kernels_supported_devices, torch.optim.AdamW
    _foreach_utils._get_foreach_kernels_supported_devices = lambda: [*devices(), "cpu"]
    torch.optim.AdamW = functools.partial(adamw, fused=True)

    def undo() -> None:
        _foreach_utils._get_foreach_kernels_supported_devices, torch.optim.AdamW = devices, adamw

    return undo


def make_data(root: Path, frames: int, imgsz: int) -> Path:
    """A client's YOLO export: ``frames`` frames (4:3, long side ``imgsz``) with 1-3 boxes each, the same frames as
    training and validation split; the data yaml."""
    import cv2

    rs = np.random.RandomState(0)
    w, h = imgsz, imgsz * 3 // 4
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    for i in range(frames):
        img = rs.randint(0, 256, (h, w, 3), dtype=np.uint8)
        lines = []
        for _ in range(rs.randint(1, 4)):
            bw, bh = rs.uniform(0.15, 0.5, 2)
            cx, cy = rs.uniform(bw / 2, 1 - bw / 2), rs.uniform(bh / 2, 1 - bh / 2)
            c = rs.randint(CLASSES)
            cv2.rectangle(img, (int((cx - bw / 2) * w), int((cy - bh / 2) * h)),
                          (int((cx + bw / 2) * w), int((cy + bh / 2) * h)), (40 * c, 255 - 30 * c, 90), -1)
            lines.append(f"{c} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
        for split in ("train", "val"):
            cv2.imwrite(str(root / "images" / split / f"f{i:03d}.png"), img)
            (root / "labels" / split / f"f{i:03d}.txt").write_text("\n".join(lines) + "\n")
    names = "".join(f"  {k}: c{k}\n" for k in range(CLASSES))
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    return root / "data.yaml"


def _phase(phases: Phases, name: str, fn: Callable) -> Callable:
    """``fn`` counted as ``name`` (nested phases count as the inner one)."""

    def wrapped(*args, **kwargs):
        phases.stack.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            phases.stack.pop()

    return wrapped


def _instrument(phases: Phases) -> list[Callable[[], None]]:
    """Wrap each phase's entry point; the undos."""
    import torch
    from ultralytics.data.base import BaseDataset
    from ultralytics.nn.tasks import BaseModel
    from ultralytics.utils.loss import v8DetectionLoss
    from ultralytics.utils.tal import TaskAlignedAssigner

    targets = [(BaseDataset, "__getitem__", "data"), (BaseModel, "loss", "forward"),
               (v8DetectionLoss, "__call__", "loss"), (TaskAlignedAssigner, "forward", "assigner"),
               (torch.Tensor, "backward", "backward")]
    undo = []
    for owner, name, phase in targets:
        old = owner.__dict__[name]
        setattr(owner, name, _phase(phases, phase, old))
        undo.append(lambda owner=owner, name=name, old=old: setattr(owner, name, old))
    return undo


def measure(data_yaml: Path, imgsz: int, workdir: Path, gpu_like: bool = True) -> dict:
    """Ops (and host syncs) per phase of each training step after the first, and the set-up's ops and CPU seconds,
    of a process's second local training."""
    import torch

    from fedmedbench.fl.tasks.detection import yolo

    phases, marks, setup = Phases(), [], {}
    study_trainer = yolo.study_trainer

    def counted_trainer(*args, **kwargs) -> type:
        base = study_trainer(*args, **kwargs)

        class Counted(base):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.add_callback("on_train_start", lambda tr: setup.update(
                    ops=sum(n for p, n in phases.ops.items() if not p.endswith("_sync")), top=phases.other_ops.most_common(6),
                    cpu_s=time.process_time() - cpu0, wall_s=time.perf_counter() - wall0))
                self.add_callback("on_train_batch_end", lambda tr: marks.append(phases.ops.copy()))

            def _setup_train(self, *a, **k):
                super()._setup_train(*a, **k)
                if self.ema:  # whichever class the trainer gave it
                    self.ema.update = _phase(phases, "ema", self.ema.update)

            def preprocess_batch(self, batch):
                return _phase(phases, "data", super().preprocess_batch)(batch)

            def optimizer_step(self):
                return _phase(phases, "optimizer", super().optimizer_step)()

        return Counted

    def train(name: str) -> None:
        model = yolo.build_yolo("yolo11n.yaml", CLASSES, seed=0)
        yolo.train_yolo(model, data_yaml, epochs=1, batch=BATCH, imgsz=imgsz, seed=0, device=torch.device("cpu"),
                        workdir=workdir / name, select="best")

    undo = [as_on_a_gpu()] if gpu_like else []
    try:
        train("first")  # the process's first training (imports, first uses): not counted
        undo += _instrument(phases)
        yolo.study_trainer = counted_trainer
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with CountSyncs(phases):
            train("second")
    finally:
        yolo.study_trainer = study_trainer
        for u in reversed(undo):
            u()
    names = STEP_PHASES + tuple(f"{p}_sync" for p in STEP_PHASES)
    steps = [{p: after[p] - before[p] for p in names} for before, after in zip(marks, marks[1:], strict=False)]
    if len(steps) < 2:
        raise SystemExit(f"yolo_step_ops: {len(marks)} batches trained; give more --frames")
    totals = [sum(s[p] for p in STEP_PHASES) for s in steps]
    if len(set(totals)) != 1:  # a step's ops depend on nothing but its shapes: they must repeat exactly
        print(f"note: the steps' op counts differ: {totals}")
    per_phase = {p: round(statistics.median(s[p] for s in steps)) for p in names}
    syncs = {p: per_phase.pop(f"{p}_sync") for p in STEP_PHASES}
    return {"bench": "yolo_step_ops", "code": git_head(), "model": "yolo11n.yaml", "classes": CLASSES, "batch": BATCH,
            "imgsz": imgsz, "as_on_a_gpu": gpu_like, "steps_counted": len(steps), "ops": per_phase,
            "syncs": {p: n for p, n in syncs.items() if n}, "syncs_per_step": sum(syncs.values()),
            "ops_per_step": round(statistics.median(totals)),
            "setup_ops": setup.get("ops"), "setup_cpu_s": round(setup.get("cpu_s", float("nan")), 3),
            "setup_wall_s": round(setup.get("wall_s", float("nan")), 3), "setup_top": dict(setup.get("top", []))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imgsz", type=positive, default=64, help="training image size (the op counts do not depend on it)")
    ap.add_argument("--frames", type=positive, default=48, help="the client's frames (batches of 8; the first is left out)")
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--as-on-a-gpu", action=argparse.BooleanOptionalAction, default=True,
                    help="the optimizer step as on CUDA tensors (fused AdamW, foreach clipping)")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    if args.imgsz % 32:
        ap.error(f"argument --imgsz: {args.imgsz}: give a multiple of 32 (YOLO's largest stride)")
    limit_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fmb-yolo-ops-") as tmp:
        row = measure(make_data(Path(tmp) / "data", args.frames, args.imgsz), args.imgsz, Path(tmp) / "runs",
                      args.as_on_a_gpu)
    emit([row], args.out)
    for phase, n in row["ops"].items():
        print(f"{phase}: {n}")
    print(f"syncs_per_step: {row['syncs_per_step']} {row['syncs']}")
    print(f"setup: {row['setup_ops']} ops, {row['setup_cpu_s']} CPU s")
    print(f"ops_per_step: {row['ops_per_step']}")


if __name__ == "__main__":
    main()
