"""What Ultralytics' YOLO training-data pipeline produces for fixed seeds, recorded the same way under Ultralytics
8.3.48 (``tests/fixtures/ultralytics_8348/record_pipeline.py``) and under the installed one with the study's trainer
(``tests/test_ultralytics_8348.py``), so that the two can be compared array by array.

Runs under either version (it reads the version where a call differs). Nothing here imports fedmedbench: the caller
hands in the trainer class (Ultralytics' DetectionTrainer, or the study's). Everything is seeded; the synthetic data
set is written by :func:`make_dataset` from fixed numbers (no draw that depends on a library version).

Recorded (per variant, one ``.npz``):

* ``load_*``      Ultralytics' ``load_image`` of each frame (no RNG): digest, resized shape, original shape.
* ``full_*``      the training set's ``__getitem__`` for ``ORDER`` with mosaic on (``K`` samples), then after
                  ``close_mosaic`` (``K`` samples): image digest, the CHW image (uint8), cls, bboxes (xywhn),
                  and per transform step (``trace``) the digest, a 4x-subsampled image, boxes (xyxy px), cls and
                  fingerprints of Python's and NumPy's random streams after the step.
* ``stage_*``     each step alone on a fixed input with the streams reseeded right before it: Mosaic,
                  RandomPerspective after the mosaic, RandomPerspective with the mosaic closed (8.3.48: LetterBox
                  first), Albumentations (300 calls, where the list has the step), HSV, flips + Format.
* ``val_*``       the validation samples (rect batches and a square letterbox).
* ``order_*``     the training loader's sample order (3 epochs, seeds 0, 1, 4).
* ``e2e_*``       the batches of a trainer's own loaders after ``_setup_train`` (2 epochs, then the mosaic closed).
"""

from __future__ import annotations

import hashlib
import random
import sys
from copy import copy, deepcopy
from pathlib import Path

import numpy as np

IMGSZ = 160
#: (width, height) of the six synthetic frames: odd sizes so that the resize and the letterbox pads round
SIZES = [(320, 256), (256, 320), (300, 200), (320, 180), (240, 240), (333, 250)]
NAMES = {0: "grasper", 1: "hook", 2: "clipper"}
COLORS = [(40, 40, 220), (40, 200, 40), (220, 60, 40)]  # BGR per class
#: fixed box layout per frame: (class, x0, y0, w, h) as fractions of the frame
BOXES = [
    [(0, 0.10, 0.12, 0.30, 0.25), (1, 0.55, 0.50, 0.35, 0.30), (2, 0.20, 0.60, 0.12, 0.20)],
    [(1, 0.05, 0.05, 0.40, 0.20), (2, 0.50, 0.40, 0.30, 0.45)],
    [(0, 0.60, 0.10, 0.25, 0.35), (0, 0.15, 0.55, 0.30, 0.30), (2, 0.45, 0.45, 0.08, 0.10), (1, 0.80, 0.70, 0.15, 0.25)],
    [(2, 0.30, 0.20, 0.40, 0.50)],
    [(0, 0.05, 0.60, 0.25, 0.30), (1, 0.40, 0.10, 0.20, 0.60), (2, 0.70, 0.30, 0.25, 0.25)],
    [(1, 0.12, 0.30, 0.33, 0.22), (0, 0.58, 0.58, 0.30, 0.33)],
]
ORDER = [2, 5, 0, 3, 1, 4]  # the index sequence read from the training set (mosaic on, then closed)
SEED = 0
BATCH = 4


# ----------------------------------------------------------------------------------------------------------- data
def frame(i: int) -> tuple[np.ndarray, list[str]]:
    """Frame ``i`` (BGR uint8) and its YOLO label lines, from fixed numbers only."""
    import cv2

    w, h = SIZES[i]
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 200) // w + 20, (yy * 200) // h + 30, ((xx + 2 * yy) * 150) // (w + 2 * h) + 60], -1)
    img = img.astype(np.uint8)
    img[(yy // 6) % 4 == 0] //= 2  # horizontal stripes: flips, blurs and warps show
    lines = []
    for c, fx, fy, fw, fh in BOXES[i]:
        x0, y0, bw, bh = round(fx * w), round(fy * h), round(fw * w), round(fh * h)
        cv2.rectangle(img, (x0, y0), (x0 + bw - 1, y0 + bh - 1), COLORS[c], -1)
        cv2.line(img, (x0, y0), (x0 + bw - 1, y0 + bh - 1), (255, 255, 255), 2)  # an asymmetric mark
        lines.append(f"{c} {(x0 + bw / 2) / w:.6f} {(y0 + bh / 2) / h:.6f} {bw / w:.6f} {bh / h:.6f}")
    return img, lines


def make_dataset(root: str | Path) -> Path:
    """Write the six frames (PNG) with labels as ``train`` and ``val`` splits under ``root``; the data yaml."""
    import cv2

    root = Path(root)
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(len(SIZES)):
            img, lines = frame(i)
            cv2.imwrite(str(root / "images" / split / f"f{i}.png"), img)
            (root / "labels" / split / f"f{i}.txt").write_text("\n".join(lines) + "\n")
    names = "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    return yaml


# ------------------------------------------------------------------------------------------------------- helpers
def ul_version() -> str:
    import ultralytics

    return ultralytics.__version__


def is_83() -> bool:
    return ul_version().startswith("8.3.")


def reseed(seed: int) -> None:
    """What Ultralytics' ``init_seeds`` seeds (Python, NumPy, torch)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def digest(a) -> str:
    a = np.ascontiguousarray(np.asarray(a))
    return hashlib.sha1(str(a.shape).encode() + str(a.dtype).encode() + a.tobytes()).hexdigest()[:16]


def rng_fp() -> tuple[str, str]:
    """Fingerprints of Python's and NumPy's global streams (equal = same state)."""
    py = hashlib.sha1(repr(random.getstate()).encode()).hexdigest()[:12]
    st = np.random.get_state()
    nps = hashlib.sha1(st[1].tobytes() + str(st[2:]).encode()).hexdigest()[:12]
    return py, nps


def boxes_px(labels: dict) -> np.ndarray:
    """The labels' boxes as xyxy pixels (a copy; labels untouched)."""
    inst = labels.get("instances")
    if inst is None:
        return np.zeros((0, 4))
    b = deepcopy(inst)
    b.convert_bbox(format="xyxy")
    if b.normalized:
        h, w = labels["img"].shape[:2]
        b.denormalize(w, h)
    return np.asarray(b.bboxes, dtype=np.float64).reshape(-1, 4)


def cls_of(labels: dict) -> np.ndarray:
    c = labels.get("cls")
    return np.zeros(0) if c is None else np.asarray(c, dtype=np.float64).reshape(-1)


def as_numpy_img(img):
    if hasattr(img, "result"):  # the study's pixel thread hands a Future
        img = img.result()
    if hasattr(img, "numpy"):
        img = img.numpy()
    return np.asarray(img)


def small(img, side: int = 40) -> np.ndarray:
    """A subsample of ``img`` (HWC or CHW) of about ``side`` pixels a side (every k-th row and column), a copy."""
    img = np.asarray(img)
    chw = img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[-1] not in (1, 3)
    h = img.shape[1] if chw else img.shape[0]
    k = max(1, h // side)
    return (img[:, ::k, ::k] if chw else img[::k, ::k]).copy()


def step_name(step) -> str:
    inner = getattr(step, "step", None)  # the study's deferring wrappers
    name = type(step).__name__ + (f"[{type(inner).__name__}]" if inner is not None else "")
    d = getattr(step, "direction", None)
    return name + (f"({d})" if d else "")


class Traced:
    """A transform step that records what it returned (image digest, 4x subsample, boxes, cls, RNG)."""

    def __init__(self, step, log: list) -> None:
        self.step, self.log, self.name = step, log, step_name(step)

    def __getattr__(self, key):
        if key in ("step", "log", "name"):
            raise AttributeError(key)
        return getattr(self.step, key)

    def __call__(self, labels):
        out = self.step(labels)
        img = out.get("img")
        if img is not None and not hasattr(img, "result"):
            img = as_numpy_img(img)
            thumb = small(img)  # a copy: later steps change images in place
        else:
            img, thumb = np.zeros(0, np.uint8), np.zeros(0, np.uint8)
        boxes = boxes_px(out) if "instances" in out else np.asarray(out.get("bboxes", np.zeros((0, 4)))).reshape(-1, 4)
        self.log.append(dict(name=self.name, digest=digest(img), shape=tuple(img.shape), thumb=thumb,
                             boxes=np.asarray(boxes, np.float64), cls=cls_of(out), rng=rng_fp()))
        return out


def trace(compose, log: list) -> None:
    """Wrap every step of ``compose`` (and of nested lists) with :class:`Traced`."""
    steps = []
    for t in compose.transforms:
        if type(t).__name__ == "Compose":
            trace(t, log)
            steps.append(t)
        else:
            steps.append(Traced(t, log))
    compose.transforms = steps


def flat_steps(compose) -> list:
    out = []
    for t in compose.transforms:
        out.extend(flat_steps(t) if type(t).__name__ == "Compose" else [t])
    return out


def find_step(compose, name: str):
    for t in flat_steps(compose):
        base = getattr(t, "step", t)
        if type(t).__name__ == name or type(base).__name__ == name:
            return t
    return None


# ------------------------------------------------------------------------------------------------------ trainer
def _stride_only():
    import torch

    m = torch.nn.Module()
    m.stride = torch.tensor([8.0, 16.0, 32.0])
    return m


def make_trainer(trainer_cls, data_yaml: Path, workdir: Path, seed: int = SEED):
    """A detection trainer for the probe's data (the study's settings: batch 4 here, imgsz ``IMGSZ``, CPU)."""
    args = dict(model="yolo11n.yaml", data=str(data_yaml), epochs=20, batch=BATCH, imgsz=IMGSZ, seed=seed,
                deterministic=True, device="cpu", workers=0, project=str(workdir), name="train", exist_ok=True,
                plots=False, save=False, val=False, amp=False, verbose=False)
    trainer = trainer_cls(overrides=args)
    trainer.model = _stride_only()  # yolo11n's strides; the probe needs no network
    return trainer


def train_set(trainer):
    return trainer.build_dataset(trainer.data["train"], mode="train", batch=BATCH)


def close(ds, trainer) -> None:
    """What the trainer does at ``epochs - close_mosaic`` (8.3.48 ``engine/trainer.py:754-756``)."""
    ds.mosaic = False
    ds.close_mosaic(hyp=copy(trainer.args))


def sample_record(s: dict) -> dict:
    img = as_numpy_img(s["img"])
    return dict(img=small(img, 80).astype(np.uint8), digest=digest(img), shape=np.array(img.shape), cls=np.asarray(s["cls"], np.float64).reshape(-1),
                bboxes=np.asarray(s["bboxes"], np.float64).reshape(-1, 4),
                batch_idx=np.asarray(s["batch_idx"], np.float64).reshape(-1))


# ------------------------------------------------------------------------------------------------------ probes
def probe_full(trainer, traced: bool = True) -> dict:
    """The training set's samples for ``ORDER``: mosaic on, then closed; with the per-step trace."""
    out = {}
    reseed(SEED)
    ds = train_set(trainer)
    for phase in ("mosaic", "closed"):
        if phase == "closed":
            close(ds, trainer)
        log: list = []
        if traced:
            trace(ds.transforms, log)
        for j, i in enumerate(ORDER):
            start = len(log)
            rec = sample_record(ds[i])
            for k, v in rec.items():
                out[f"full_{phase}_{j}_{k}"] = v
            steps = log[start:]
            out[f"full_{phase}_{j}_steps"] = np.array([e["name"] for e in steps])
            out[f"full_{phase}_{j}_step_digest"] = np.array([e["digest"] for e in steps])
            out[f"full_{phase}_{j}_step_rng"] = np.array([e["rng"] for e in steps])
            prev = None
            for n, e in enumerate(steps):
                if e["digest"] != prev:  # a thumb only where the step changed the pixels
                    out[f"full_{phase}_{j}_s{n}_thumb"] = e["thumb"]
                prev = e["digest"]
                out[f"full_{phase}_{j}_s{n}_boxes"] = e["boxes"]
                out[f"full_{phase}_{j}_s{n}_cls"] = e["cls"]
        out[f"full_{phase}_pipeline"] = np.array([step_name(t) for t in flat_steps(ds.transforms)])
    return out


def probe_stages(trainer) -> dict:
    """Each step alone, on fixed inputs, with the streams reseeded right before it."""
    from ultralytics.data.augment import LetterBox

    out = {}
    reseed(SEED)
    ds = train_set(trainer)
    # frames as Ultralytics loads them (no RNG); this also fills the mosaic buffer in index order
    for i in range(len(SIZES)):
        lab = ds.get_image_and_label(i)
        out[f"load_{i}_digest"] = np.array(digest(lab["img"]))
        out[f"load_{i}_hw"] = np.array(lab["resized_shape"])
        out[f"load_{i}_hw0"] = np.array(lab["ori_shape"])
        out[f"load_{i}_boxes"] = boxes_px(lab)
    out["buffer"] = np.array(list(ds.buffer))
    mosaic, affine = find_step(ds.transforms, "Mosaic"), find_step(ds.transforms, "RandomPerspective")
    for s in range(4):
        lab = ds.get_image_and_label(s)
        reseed(1000 + s)
        m = mosaic(lab)
        out[f"stage_mosaic_{s}_digest"] = np.array(digest(m["img"]))
        out[f"stage_mosaic_{s}_thumb"] = small(m["img"])
        out[f"stage_mosaic_{s}_boxes"] = boxes_px(m)
        out[f"stage_mosaic_{s}_cls"] = cls_of(m)
        out[f"stage_mosaic_{s}_rng"] = np.array(rng_fp())
        reseed(2000 + s)
        p = affine(m)
        out[f"stage_persp_mosaic_{s}_img"] = small(p["img"], 80)
        out[f"stage_persp_mosaic_{s}_digest"] = np.array(digest(p["img"]))
        out[f"stage_persp_mosaic_{s}_boxes"] = boxes_px(p)
        out[f"stage_persp_mosaic_{s}_cls"] = cls_of(p)
        out[f"stage_persp_mosaic_{s}_rng"] = np.array(rng_fp())
    # HSV, flips and Format on a fixed image (frame 0 as loaded, letterboxed to a square)
    base = LetterBox(new_shape=(IMGSZ, IMGSZ))(ds.get_image_and_label(0))
    hsv = find_step(ds.transforms, "RandomHSV83") or find_step(ds.transforms, "RandomHSV")
    for s in range(3):
        lab = deepcopy(base)
        reseed(4000 + s)
        r = hsv(lab)
        out[f"stage_hsv_{s}_img"] = small(r["img"])
        out[f"stage_hsv_{s}_digest"] = np.array(digest(r["img"]))
    flips = [t for t in flat_steps(ds.transforms) if type(getattr(t, "step", t)).__name__ == "RandomFlip"]
    fmt = [t for t in flat_steps(ds.transforms) if type(getattr(t, "step", t)).__name__ == "Format"][0]
    for s in range(4):
        lab = deepcopy(base)
        reseed(5000 + s)
        for t in flips:
            lab = t(lab)
        lab = fmt(lab)
        rec = sample_record(lab)
        out[f"stage_flipfmt_{s}_img"] = small(rec["img"])
        out[f"stage_flipfmt_{s}_digest"] = np.array(rec["digest"])
        out[f"stage_flipfmt_{s}_bboxes"] = rec["bboxes"]
    # Albumentations: 300 calls on one image, streams seeded once; which calls changed the image
    alb = find_step(ds.transforms, "Albumentations")
    out["stage_alb_present"] = np.array(alb is not None and getattr(alb, "transform", None) is not None)
    if alb is not None and getattr(alb, "transform", None) is not None:
        for run in range(2):  # two fresh steps from the same seeds, as two trainings: equal when reproducible
            step = type(getattr(alb, "step", alb))(p=1.0)
            reseed(6000)
            img0 = base["img"].copy()
            changed, digs = [], []
            for _ in range(300):
                lab = {"img": img0.copy(), "cls": base["cls"].copy(), "instances": deepcopy(base["instances"])}
                r = step(lab)
                changed.append(not np.array_equal(r["img"], img0))
                digs.append(digest(r["img"]))
            out[f"stage_alb_run{run}_changed"] = np.array(changed)
            out[f"stage_alb_run{run}_digests"] = np.array(digs)
            out[f"stage_alb_run{run}_rng"] = np.array(rng_fp())
    # closed mosaic: RandomPerspective on each frame as loaded (8.3.48 letterboxes it first)
    close(ds, trainer)
    affine_c = find_step(ds.transforms, "RandomPerspective")
    for i in range(len(SIZES)):
        lab = ds.get_image_and_label(i)
        reseed(3000 + i)
        p = affine_c(lab)
        out[f"stage_persp_closed_{i}_img"] = small(p["img"], 80)
        out[f"stage_persp_closed_{i}_digest"] = np.array(digest(p["img"]))
        out[f"stage_persp_closed_{i}_boxes"] = boxes_px(p)
        out[f"stage_persp_closed_{i}_cls"] = cls_of(p)
    return out


def probe_val(trainer) -> dict:
    """The validation samples: the trainer's val set (rect, as the study's evaluation) and a square letterbox."""
    from ultralytics.data import build_yolo_dataset

    out = {}
    for kind, rect in (("rect", True), ("square", False)):
        ds = build_yolo_dataset(trainer.args, trainer.data["val"], BATCH, trainer.data, mode="val", rect=rect, stride=32)
        for i in range(len(SIZES)):
            s = ds[i]
            rec = sample_record(s)
            out[f"val_{kind}_{i}_img"] = rec["img"]
            out[f"val_{kind}_{i}_digest"] = np.array(rec["digest"])
            out[f"val_{kind}_{i}_shape"] = rec["shape"]
            out[f"val_{kind}_{i}_bboxes"] = rec["bboxes"]
            out[f"val_{kind}_{i}_cls"] = rec["cls"]
            out[f"val_{kind}_{i}_ratio_pad"] = np.array(_flat(s.get("ratio_pad")), np.float64)
            out[f"val_{kind}_{i}_im_file"] = np.array(Path(s["im_file"]).name)
    return out


def _flat(x) -> list:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [float(x)]


def probe_order(trainer_cls, data_yaml: Path, workdir: Path) -> dict:
    """The training loader's sample order over 3 epochs for seeds 0, 1, 4 (batch 2), as the trainer builds it."""
    out = {}
    for seed in (0, 1, 4):
        tr = make_trainer(trainer_cls, data_yaml, workdir, seed=seed)
        reseed(seed)  # init_seeds(seed) as the trainer's __init__ (torch.initial_seed() = seed)
        loader = tr.get_dataloader(tr.data["train"], batch_size=2, rank=-1, mode="train")
        order = []
        for _ in range(3):
            for b in loader:
                order.extend(int(Path(f).stem[1:]) for f in b["im_file"])
        out[f"order_seed{seed}"] = np.array(order)
    return out


def hide_albumentations() -> None:
    """Make ``import albumentations`` fail, as where it is not installed (UltraFlwr's setup.py lists none)."""
    sys.modules["albumentations"] = None  # type: ignore[assignment]


def probe_e2e(trainer_cls, data_yaml: Path, workdir: Path) -> dict:
    """What a training really sees: the trainer seeds (``init_seeds`` in its ``__init__``), ``_setup_train`` builds
    the model (yolo11n.yaml), the training and validation loaders; then the batches of 2 epochs with mosaic,
    ``_close_dataloader_mosaic`` + ``reset`` as at epoch ``epochs - close_mosaic``, 1 epoch more. Per batch: the
    files in order, each image's digest and a 40-px subsample, cls, bboxes, batch_idx; the streams' fingerprints
    after the setup and after each epoch (no model step runs: on a CPU with workers=0 the loss and optimizer
    draw nothing from Python's or NumPy's stream)."""
    out = {}
    args = dict(model="yolo11n.yaml", data=str(data_yaml), epochs=20, batch=BATCH, imgsz=IMGSZ, seed=SEED,
                deterministic=True, device="cpu", workers=0, project=str(workdir), name="e2e", exist_ok=True,
                plots=False, save=False, val=False, amp=False, verbose=False)
    tr = trainer_cls(overrides=args)
    tr._setup_train(1) if is_83() else tr._setup_train()
    out["e2e_rng_setup"] = np.array(rng_fp())
    n = 0
    for epoch in range(3):
        if epoch == 2:
            tr._close_dataloader_mosaic()
            tr.train_loader.reset()
        for b in tr.train_loader:
            k = f"e2e_b{n}"
            out[k + "_files"] = np.array([Path(f).name for f in b["im_file"]])
            imgs = b["img"].numpy()
            out[k + "_digests"] = np.array([digest(im) for im in imgs])
            out[k + "_thumbs"] = np.stack([small(im) for im in imgs])
            out[k + "_cls"] = b["cls"].numpy().reshape(-1).astype(np.float64)
            out[k + "_bboxes"] = b["bboxes"].numpy().reshape(-1, 4).astype(np.float64)
            out[k + "_batch_idx"] = b["batch_idx"].numpy().reshape(-1).astype(np.float64)
            n += 1
        out[f"e2e_rng_epoch{epoch}"] = np.array(rng_fp())
    out["e2e_batches"] = np.array(n)
    return out
