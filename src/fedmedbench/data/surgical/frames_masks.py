"""Generic "frames + masks per video" layout for sites without an official loader
(RARP, Hyst-YT, Lob-YT part masks; GraSP binary masks; the simulator set for SERQ).

Expected layout (``<surgical.root>/<folder>/``)::

    <split>/<video>/frames/<stem>.png|jpg     split = train | val | test
    <split>/<video>/masks/<stem>.png          grey label image, same stem (optional: a frame
                                              without a mask is an unlabelled history frame)

The frame number is the last number in the stem (``frame_regex``); timestamps need the
frame rate of those numbers (there is no file to read it from): ``fps`` in the config, else the
rate listed for the dataset's ``release`` (``facts.FRAME_RATES``, with how sure it is). ``label_set`` is ``parts`` (background/shaft/wrist/clasper) or ``binary``
(background/instrument); ``label_values`` maps raw grey values to its classes (default
parts: 0-3 as is; binary: 0 -> background, 1 and 255 -> instrument).
"""

from __future__ import annotations

import re

from fedmedbench.data.surgical.badfiles import DatasetNotFoundError
from fedmedbench.data.surgical.base import AdapterContext, resolve_fps
from fedmedbench.data.surgical.fsutil import image_size, sorted_images
from fedmedbench.data.surgical.schema import LABEL_SETS, SPLITS
from fedmedbench.data.surgical.segmasks import (
    FRAME_RE,
    checked_mask,
    frame_number,
    frame_row,
    report_masks_without_images,
    save_canonical,
    value_map,
)

TASK = "segmentation"
DEFAULT_VALUES = {"parts": {0: "background", 1: "shaft", 2: "wrist", 3: "clasper"},
                  "binary": {0: "background", 1: "instrument", 255: "instrument"}}




def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    splits = [s for s in SPLITS if (ctx.root / s).is_dir()]
    if not splits:
        raise DatasetNotFoundError(f"surgical dataset '{ctx.name}': no train/, val/ or test/ folder in {ctx.root}; "
                                   "expected <split>/<video>/frames/ and masks/ (see docs/surgical_data.md)")
    fps, fps_source = resolve_fps(ctx, None, required=True)
    label_set = ctx.opt("label_set", "parts")
    if label_set not in LABEL_SETS:
        raise ValueError(f"surgical.datasets.{ctx.name}.label_set must be one of {sorted(LABEL_SETS)}")
    lut = value_map(ctx, DEFAULT_VALUES[label_set], label_set)
    pattern = re.compile(ctx.opt("frame_regex", FRAME_RE.pattern))
    rows = []
    for split in splits:
        for vdir in sorted(p for p in (ctx.root / split).iterdir() if p.is_dir()):
            vid = vdir.name
            report_masks_without_images(ctx, [vdir / "masks"], vdir / "frames", vid, by="stem")
            for img in sorted_images(vdir / "frames"):
                frame = frame_number(img.stem, pattern)
                if frame is None:
                    ctx.bad.add(img, f"no frame number in the file name (frame_regex {pattern.pattern!r})", vid)
                    continue
                size = image_size(img)
                if size is None:
                    ctx.bad.add(img, "image missing or unreadable", vid, frame)
                    continue
                mask_file = vdir / "masks" / f"{img.stem}.png"
                mask_path = ""
                if mask_file.exists():
                    mask = checked_mask(ctx, mask_file, lut, size, vid, frame)
                    if mask is None:
                        continue
                    mask_path = save_canonical(ctx, vid, frame, mask)
                rows.append(frame_row(ctx, vid, frame, fps, img, size, split, mask_path))
    return rows, {"task": TASK, "classes": list(LABEL_SETS[label_set]), "label_set": label_set, "fps": fps,
                  "fps_source": fps_source, "split_source": "split folders"}
