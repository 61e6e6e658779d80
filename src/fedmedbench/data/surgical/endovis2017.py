"""EndoVis2017 Robotic Instrument Segmentation (Allan et al. 2019): per-instrument part masks.

Release layout (``<surgical.root>/EndoVis2017/``)::

    train/instrument_dataset_1/left_frames/frame000.png ... frame224.png   (2 Hz, 1920x1080)
                              /ground_truth/Left_Prograsp_Forceps_labels/frame000.png
                              /ground_truth/Maryland_Bipolar_Forceps_labels/frame000.png
                              /ground_truth/Other_labels/frame000.png
    test/instrument_dataset_1/left_frames/frame225.png ... frame299.png
                             /[ground_truth/]PartsSegmentation/frame225.png   (test labels, when placed there)

Each ``*_labels`` image marks one instrument's parts with the grey values of the release's
``parts_mapping.json``: 10 = shaft, 20 = wrist, 30 = clasper, 40 = probe (``label_values``);
the probe (a drop-in ultrasound probe, not a robotic instrument part) is background, as in
the common reading of the release (only 10/20/30 become parts). The adapter merges the
instruments of a frame into one canonical part mask. The separately released test labels
come merged, one ``PartsSegmentation`` image per frame, with other grey values: 30 = shaft,
100 = wrist, 255 = clasper, 200 = probe (``merged_label_values``); ``BinarySegmentation``
and ``TypeSegmentation`` next to it are not read. ``Other_labels`` (non-robotic
instruments, no parts) is skipped by default (``exclude_label_dirs``). Test sequences 1-8 continue the training
procedures of the same number (frames 225-299), so they keep the same ``video_id``: the
original protocol, which FedST follows, splits by time within a procedure. Frames without
any label folder (test frames before the labels are added) are indexed as unlabelled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedmedbench.data.surgical.base import AdapterContext, resolve_fps, split_folders
from fedmedbench.data.surgical.facts import FRAME_RATES
from fedmedbench.data.surgical.schema import PART_CLASSES
from fedmedbench.data.surgical.segmasks import (
    checked_mask,
    frame_row,
    readable_frames,
    report_masks_without_images,
    save_canonical,
    value_map,
)

TASK = "segmentation"
OFFICIAL_FPS = FRAME_RATES["endovis2017"].fps  # "we sample the frames from 30 Hz video at 2 Hz"
OFFICIAL_SPLIT_DIRS = {"train": "train", "test": "test"}
#: per-instrument ``*_labels`` masks (training release, its parts_mapping.json); 40 = probe
OFFICIAL_VALUES = {10: "shaft", 20: "wrist", 30: "clasper", 40: "background"}
#: merged ``PartsSegmentation`` masks of the test label release; 200 = probe
OFFICIAL_MERGED_VALUES = {30: "shaft", 100: "wrist", 255: "clasper", 200: "background"}
MERGED_DIRS = ("PartsSegmentation",)


def _label_dirs(vdir: Path, exclude: set[str]) -> tuple[list[Path], bool]:
    """Per-instrument label folders (merged=False) or one merged parts folder (merged=True)."""
    for parent in (vdir, vdir / "ground_truth"):
        for name in MERGED_DIRS:
            if (parent / name).is_dir():
                return [parent / name], True
    gt = vdir / "ground_truth"
    if not gt.is_dir():
        return [], False
    return sorted(d for d in gt.iterdir() if d.is_dir() and d.name not in exclude), False


def _frame_mask(ctx, frame_img, label_dirs, lut, size, vid, frame):
    merged = np.zeros((size[1], size[0]), dtype=np.uint8)
    for d in label_dirs:
        mapped = checked_mask(ctx, d / frame_img.name, lut, size, vid, frame)
        if mapped is None:
            return None
        merged = np.where(mapped > 0, mapped, merged)
    return merged


def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    present = split_folders(ctx, OFFICIAL_SPLIT_DIRS, "EndoVis2017")
    fps, fps_source = resolve_fps(ctx, OFFICIAL_FPS, required=True)
    lut = value_map(ctx, OFFICIAL_VALUES, "parts")
    merged_lut = value_map(ctx, OFFICIAL_MERGED_VALUES, "parts", key="merged_label_values")
    exclude = set(ctx.opt("exclude_label_dirs", ["Other_labels"]))
    rows = []
    for d, split in sorted(present.items()):
        for vdir in sorted(p for p in (ctx.root / d).iterdir() if p.is_dir()):
            vid = vdir.name
            label_dirs, merged = _label_dirs(vdir, exclude)
            report_masks_without_images(ctx, label_dirs, vdir / "left_frames", vid)
            for img, frame, size in readable_frames(ctx, vdir / "left_frames", vid):
                mask_path = ""
                if label_dirs:
                    mask = _frame_mask(ctx, img, label_dirs, merged_lut if merged else lut, size, vid, frame)
                    if mask is None:
                        continue
                    mask_path = save_canonical(ctx, vid, frame, mask)
                rows.append(frame_row(ctx, vid, frame, fps, img, size, split, mask_path))
    return rows, {"task": TASK, "classes": list(PART_CLASSES), "label_set": "parts", "fps": fps,
                  "fps_source": fps_source, "split_source": f"release folders {present}"}
