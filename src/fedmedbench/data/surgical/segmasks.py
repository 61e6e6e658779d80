"""Shared steps of the segmentation adapters: read a label image, map its values, save the canonical mask.

A canonical mask is a single-channel uint8 PNG whose pixel value is the index of the
class in the dataset's label set (``parts``: background, shaft, wrist, clasper;
``binary``: background, instrument).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fedmedbench.data.surgical.badfiles import BadFileError
from fedmedbench.data.surgical.base import AdapterContext, timestamp
from fedmedbench.data.surgical.fsutil import read_image, write_png
from fedmedbench.data.surgical.schema import LABEL_SETS

FRAME_RE = re.compile(r"(\d+)(?!.*\d)")  # the last number in a file stem


def frame_number(stem: str, pattern: re.Pattern = FRAME_RE) -> int | None:
    m = pattern.search(stem)
    return int(m.group(1)) if m else None


def grey_mask(path: Path) -> tuple[np.ndarray | None, str | None]:
    """A single-channel label image, or the reason it is not one."""
    img = read_image(path)
    if img is None:
        return None, "mask missing or unreadable"
    if img.ndim == 3:
        if img.shape[2] == 4:
            img = img[..., :3]
        if not (np.array_equal(img[..., 0], img[..., 1]) and np.array_equal(img[..., 1], img[..., 2])):
            return None, "mask has colour channels, expected a grey label image"
        img = img[..., 0]
    return img, None


def map_values(mask: np.ndarray, value_to_class: dict[int, int]) -> tuple[np.ndarray | None, str | None]:
    """Raw label values -> canonical class indices; a value outside the map is an error."""
    values = np.unique(mask)
    unknown = [int(v) for v in values if int(v) not in value_to_class]
    if unknown:
        return None, f"label value(s) {unknown} not in the label map {sorted(value_to_class)}"
    lut = np.zeros(max(256, int(values.max()) + 1), dtype=np.uint8)
    for raw, cls in value_to_class.items():
        if 0 <= raw < lut.size:
            lut[raw] = cls
    return lut[mask], None


def checked_mask(ctx: AdapterContext, path: Path, lut: dict[int, int], size: tuple[int, int], vid: str,
                 frame: int) -> np.ndarray | None:
    """A grey mask of the image's size with every value in ``lut``, mapped to classes; else a reported bad file."""
    raw, problem = grey_mask(path)
    if problem is None and raw.shape != (size[1], size[0]):
        problem = f"mask size {raw.shape[1]}x{raw.shape[0]} differs from the image size {size[0]}x{size[1]}"
    if problem is None:
        mapped, problem = map_values(raw, lut)
    if problem:
        ctx.bad.add(path, problem, vid, frame)
        return None
    return mapped


def readable_frames(ctx: AdapterContext, frame_dir: Path, vid: str):
    """(image, frame number, (w, h)) of each frame in ``frame_dir``; unnumbered or unreadable ones are reported."""
    from fedmedbench.data.surgical.fsutil import image_size, sorted_images

    for img in sorted_images(frame_dir):
        frame = frame_number(img.stem)
        if frame is None:
            ctx.bad.add(img, "no frame number in the file name", vid)
            continue
        size = image_size(img)
        if size is None:
            ctx.bad.add(img, "image missing or unreadable", vid, frame)
            continue
        yield img, frame, size


def report_masks_without_images(ctx: AdapterContext, mask_dirs: list[Path], frame_dir: Path, vid: str,
                                 by: str = "name") -> None:
    """A mask whose frame image is missing is a labelled frame lost: a bad file, not a silent drop. Masks are
    matched to the images of ``frame_dir`` by file name (``by="name"``) or by stem (``by="stem"``)."""
    from fedmedbench.data.surgical.fsutil import sorted_images

    images = sorted_images(frame_dir) if frame_dir.is_dir() else []
    have = {getattr(p, by) for p in images}
    for d in mask_dirs:
        for mask in sorted_images(d) if d.is_dir() else []:
            if getattr(mask, by) not in have:
                ctx.bad.add(mask, f"label mask without its image (no {frame_dir.name}/{mask.stem}.* frame)", vid,
                            frame_number(mask.stem))


def value_map(ctx: AdapterContext, default: dict, label_set: str, key: str = "label_values") -> dict[int, int]:
    """The option ``key`` (raw value -> class name) resolved to class indices of the label set."""
    classes = LABEL_SETS[label_set]
    raw = ctx.opt(key, default)
    out = {}
    for value, name in raw.items():
        if name not in classes:
            raise ValueError(f"surgical.datasets.{ctx.name}.{key}: '{name}' is not a class of the "
                             f"'{label_set}' label set {classes}")
        out[int(value)] = classes.index(name)
    out.setdefault(0, 0)
    return out


def save_canonical(ctx: AdapterContext, video: str, frame: int, mask: np.ndarray) -> str:
    safe = _safe(video)
    owner = ctx.mask_folders.setdefault(safe, video)
    if owner != video:
        raise BadFileError(f"surgical dataset '{ctx.name}': videos '{owner}' and '{video}' (under {ctx.root}) both map "
                           f"to the mask folder '{safe}' once their names are made file-system safe; rename one of them")
    rel = Path(safe) / f"{frame:06d}.png"
    write_png(ctx.mask_dir / rel, mask.astype(np.uint8))
    return str(ctx.mask_dir_final / rel)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def frame_row(ctx: AdapterContext, vid: str, frame: int, fps: float, img: Path, size: tuple[int, int], split: str,
              mask_path: str) -> dict:
    """One index row of a segmentation dataset (no boxes; labelled when a canonical mask was written)."""
    return {"dataset": ctx.name, "video_id": vid, "frame": frame, "timestamp_s": timestamp(frame, fps),
            "image_path": str(img), "width": size[0], "height": size[1], "split": split,
            "labelled": bool(mask_path), "boxes": "", "mask_path": mask_path}
