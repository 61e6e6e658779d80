"""Ultralytics' datasets reading the frames stored at training size (``engine.image_cache``, :mod:`.frame_cache`).

Ultralytics' loader decodes a frame and resizes its long side to ``imgsz`` each time it reads it (only its RAM
cache, which the study does not use, keeps the result). Where the stage holds ``<name>.s<imgsz>.npy`` links,
the dataset's ``load_image`` reads that file instead: the same array as the decode and resize, reported with
the frame's original shape as the loader reports it, and put in the loader's mosaic buffer exactly as the
loader puts it (the mosaic draws its other images from that buffer). So the samples, and the validation
scores, are the same bits, without the decode or the resize. On the first frame the stored file is compared
with Ultralytics' own load; where they differ (another Ultralytics resize rule) nothing is replaced and the
dataset decodes as usual.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from fedmedbench.fl.tasks.detection.frame_cache import original_shape, sized_link


class SizedFrameLoader:
    """A dataset's ``load_image`` reading the frames stored at its ``imgsz`` (a module-level class, so that the
    dataset still pickles for loader worker processes)."""

    def __init__(self, dataset: Any, load: Any, entries: list[tuple[str, tuple[int, int]] | None]) -> None:
        self.dataset, self.load, self.entries = dataset, load, entries

    def __call__(self, i: int, rect_mode: bool = True, resize_short: bool = False):
        ds = self.dataset
        entry = self.entries[i]
        if ds.ims[i] is not None or entry is None or not rect_mode or resize_short:
            return self.load(i, rect_mode, resize_short)
        im = np.load(entry[0])
        hw0 = entry[1]
        if ds.augment and ds.cache != "ram":  # Ultralytics' mosaic buffer, as its load_image keeps it
            ds.ims[i], ds.im_hw0[i], ds.im_hw[i] = im, hw0, im.shape[:2]
            ds.buffer.append(i)
            if 1 < len(ds.buffer) >= ds.max_buffer_length:
                j = ds.buffer.pop(0)
                ds.ims[j], ds.im_hw0[j], ds.im_hw[j] = None, None, None
        return im, hw0, im.shape[:2]


def _entries(dataset: Any, imgsz: int) -> list[tuple[str, tuple[int, int]] | None]:
    out: list[tuple[str, tuple[int, int]] | None] = []
    for f in dataset.im_files:
        link = sized_link(Path(f), imgsz)
        try:
            target = Path(link).resolve(strict=True)
            out.append((str(target), original_shape(target)))
        except (OSError, ValueError):  # no stored frame (not cached, unreadable): decoded as usual
            out.append(None)
    return out


def _own_load(dataset: Any, i: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Ultralytics' own load of frame ``i``, leaving ``dataset`` (its buffer) as it was."""
    probe = copy.copy(dataset)
    probe.ims, probe.im_hw0, probe.im_hw = [None] * dataset.ni, [None] * dataset.ni, [None] * dataset.ni
    probe.buffer, probe.augment = [], False
    im, hw0, _ = type(dataset).load_image(probe, i)
    return im, tuple(hw0)


def read_sized_frames(dataset: Any, log=None) -> int:
    """Make ``dataset`` (an Ultralytics YOLO dataset) read the frames stored at its ``imgsz`` where its stage
    links them; how many it reads so (0: none stored, an integer ``imgsz`` missing, or a stored frame that is
    not Ultralytics' own load, in which case ``log`` is told)."""
    if not all(hasattr(dataset, key) for key in ("imgsz", "im_files", "load_image", "channels", "cache")):
        return 0  # not an Ultralytics image dataset
    imgsz = dataset.imgsz
    if isinstance(dataset.load_image, SizedFrameLoader):
        return sum(e is not None for e in dataset.load_image.entries)
    if not isinstance(imgsz, int) or dataset.channels != 3 or dataset.cache == "ram":
        return 0
    entries = _entries(dataset, imgsz)
    first = next((i for i, e in enumerate(entries) if e is not None), None)
    if first is None:
        return 0
    want, hw0 = _own_load(dataset, first)
    stored = np.load(entries[first][0])
    if hw0 != entries[first][1] or want.shape != stored.shape or not np.array_equal(want, stored):
        if log is not None:
            log(f"image cache: {dataset.im_files[first]}: the frame stored at {imgsz} px is not what Ultralytics "
                "loads; frames decoded as they are read")
        return 0
    dataset.load_image = SizedFrameLoader(dataset, dataset.load_image, entries)
    return sum(e is not None for e in entries)
