"""EndoVis2018 Robotic Scene Segmentation (Allan et al. 2020): colour-coded scene labels.

Release layout (``<surgical.root>/EndoVis2018/``; the training archives may keep their
release folders, e.g. ``train/miccai_challenge_2018_release_1/seq_1``)::

    train/[<release>/]seq_1/left_frames/frame000.png ... frame148.png   (2 Hz, 1280x1024)
                           /labels/frame000.png      RGB colour per scene class
                           /labels.json              optional: [{"name", "color": [r, g, b], "classid"}]
    test/seq_1/...

The scene classes are mapped to parts (``part_names``): instrument-shaft -> shaft,
instrument-wrist -> wrist, instrument-clasper -> clasper; every other known class
(kidney, thread, clamps, needle, suction, intestine, probe, background tissue) ->
background. A colour that is not in the colour map is a bad file. Training and test
sequence numbers name different procedures, so ``video_id`` is ``<split>-seq_<n>``.
"""

from __future__ import annotations

import json

import numpy as np

from fedmedbench.data.surgical.base import AdapterContext, resolve_fps, split_folders
from fedmedbench.data.surgical.facts import FRAME_RATES
from fedmedbench.data.surgical.fsutil import read_image
from fedmedbench.data.surgical.schema import PART_CLASSES
from fedmedbench.data.surgical.segmasks import (
    frame_row,
    readable_frames,
    report_masks_without_images,
    save_canonical,
)

TASK = "segmentation"
OFFICIAL_FPS = FRAME_RATES["endovis2018"].fps  # "recorded at 60 Hz ... we subsample this to 2 Hz"
OFFICIAL_SPLIT_DIRS = {"train": "train", "test": "test"}
OFFICIAL_COLOURS = {
    "background-tissue": (0, 0, 0), "instrument-shaft": (0, 255, 0), "instrument-clasper": (0, 255, 255),
    "instrument-wrist": (125, 255, 12), "kidney-parenchyma": (255, 55, 0), "covered-kidney": (24, 55, 125),
    "thread": (187, 155, 25), "clamps": (0, 255, 125), "suturing-needle": (255, 255, 125),
    "suction-instrument": (123, 15, 175), "small-intestine": (124, 155, 5), "ultrasound-probe": (12, 255, 141),
}
OFFICIAL_PARTS = {"instrument-shaft": "shaft", "instrument-wrist": "wrist", "instrument-clasper": "clasper"}


def _colours(ctx: AdapterContext, seq_dir) -> tuple[dict[str, tuple], str | None]:
    """Colour map of a sequence: its labels.json when present, else the configured/official map."""
    path = seq_dir / "labels.json"
    if path.is_file():
        try:
            items = json.loads(path.read_text())
            return {str(it["name"]): tuple(int(c) for c in it["color"]) for it in items}, None
        except (ValueError, KeyError, TypeError) as exc:
            return {}, f"labels.json does not parse as [{{name, color}}, ...] ({exc})"
    return {k: tuple(v) for k, v in ctx.opt("colour_map", OFFICIAL_COLOURS).items()}, None


def _decode(labels_rgb: np.ndarray, colours: dict[str, tuple], parts: dict[str, str]):
    code = (labels_rgb[..., 0].astype(np.int64) << 16) | (labels_rgb[..., 1].astype(np.int64) << 8) | labels_rgb[..., 2]
    known = {}
    for name, (r, g, b) in colours.items():
        known[(r << 16) | (g << 8) | b] = PART_CLASSES.index(parts.get(name, "background"))
    values = np.unique(code)
    unknown = [v for v in values.tolist() if v not in known]
    if unknown:
        rgb = [((v >> 16) & 255, (v >> 8) & 255, v & 255) for v in unknown[:5]]
        return None, f"label colour(s) {rgb} not in the colour map"
    out = np.zeros(code.shape, dtype=np.uint8)
    for v in values.tolist():
        out[code == v] = known[v]
    return out, None


def _sequences(split_root):
    return sorted({p.parent for p in split_root.rglob("left_frames") if p.is_dir()}, key=lambda p: str(p))


def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    present = split_folders(ctx, OFFICIAL_SPLIT_DIRS, "EndoVis2018")
    fps, fps_source = resolve_fps(ctx, OFFICIAL_FPS, required=True)
    parts = ctx.opt("part_names", OFFICIAL_PARTS)
    bad_parts = [p for p in parts.values() if p not in PART_CLASSES]
    if bad_parts:
        raise ValueError(f"surgical.datasets.{ctx.name}.part_names: {bad_parts} are not parts {PART_CLASSES}")
    rows = []
    for d, split in sorted(present.items()):
        for seq in _sequences(ctx.root / d):
            vid = f"{split}-{seq.name}"
            colours, problem = _colours(ctx, seq)
            if problem:
                ctx.bad.add(seq / "labels.json", problem, vid)
                continue
            report_masks_without_images(ctx, [seq / "labels"], seq / "left_frames", vid)
            for img, frame, size in readable_frames(ctx, seq / "left_frames", vid):
                label = seq / "labels" / img.name
                mask_path = ""
                if (seq / "labels").is_dir():
                    raw = read_image(label)
                    if raw is None or raw.ndim != 3:
                        ctx.bad.add(label, "label image missing, unreadable or not RGB", vid, frame)
                        continue
                    if raw.shape[:2] != (size[1], size[0]):
                        ctx.bad.add(label, f"mask size {raw.shape[1]}x{raw.shape[0]} differs from the image size "
                                           f"{size[0]}x{size[1]}", vid, frame)
                        continue
                    mask, problem = _decode(raw[..., 2::-1], colours, parts)  # OpenCV reads BGR(A)
                    if problem:
                        ctx.bad.add(label, problem, vid, frame)
                        continue
                    mask_path = save_canonical(ctx, vid, frame, mask)
                rows.append(frame_row(ctx, vid, frame, fps, img, size, split, mask_path))
    return rows, {"task": TASK, "classes": list(PART_CLASSES), "label_set": "parts", "fps": fps,
                  "fps_source": fps_source, "split_source": f"release folders {present}"}
