"""Decoded surgical frames kept on disk, shared by every detection job (``engine.image_cache``).

Ultralytics' loader reads ``<image>.npy`` instead of decoding ``<image>`` when that file exists and is
not older than the image (the files of its ``cache='disk'``): the same array as decoding, so the same
training batches and validation scores, without the decode (about half of a training sample's
loading on the study's frames; docs/benchmarks.md). A job's stage (``staging.py``) holds symlinks to
the exported frames; here each frame (training, validation, test) is decoded once into one folder shared
by all jobs, keyed by the frame's resolved path, size and modification time, and the stage gets a
``<name>.npy`` symlink to it. A frame read by several settings, clients or jobs is decoded and stored
once. Each file is written under a temporary name and renamed, so a job never reads a partial one; a
frame changed after its file was written is decoded again (Ultralytics skips a stale file too).

At a training size (``imgsz``, what the detection task uses) each frame is stored as Ultralytics' loader resizes
it (long side to ``imgsz``, :func:`resize_like_ultralytics`): the image its own RAM cache would hold, a tenth of
a 1920x1080 frame's bytes, with nothing left to decode or resize when it is read. The file sits in the frame's
folder of the cache, named by the size and the frame's original height and width (``<imgsz>_<h>x<w>.npy``: the
loader reports the original shape with the image), and the stage gets a ``<name>.s<imgsz>.npy`` link to it,
which :mod:`.sized_frames` makes Ultralytics' datasets read (Ultralytics itself never opens it).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedmedbench.data.surgical.fsutil import sorted_images
from fedmedbench.workflow import io

#: free disk kept beyond the files a job would add
DISK_MARGIN = 0.1


@dataclass
class CacheReport:
    """What one call did: frames decoded now, frames already on disk, bytes written now."""

    decoded: int = 0
    reused: int = 0
    bytes_written: int = 0
    skipped: str = ""  # why nothing was written (too little free disk), else empty
    unreadable: list[str] = field(default_factory=list)  # frames that did not decode (not cached), with why


def decode(image: Path) -> np.ndarray:
    """The array Ultralytics' loader decodes from ``image`` (BGR, 3 channels: its ``imread`` with
    ``cv2.IMREAD_COLOR``, as its dataset reads a 3-channel set)."""
    import cv2
    from ultralytics.utils.patches import imread

    try:
        im = imread(str(image), flags=cv2.IMREAD_COLOR)
    except Exception as err:  # a decoder error of any kind names the frame
        raise ValueError(f"{image}: not a readable image ({err})") from err
    if im is None:
        raise ValueError(f"{image}: not a readable image")
    return im


def cached_path(cache: Path, image: Path) -> Path:
    """The shared file of ``image``: keyed by its resolved path, size and modification time (a frame replaced
    by another file, even an older one, gets a new key), in two levels of folders."""
    real = image.resolve()
    st = real.stat()
    digest = hashlib.sha1(f"{real}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    return cache / digest[:2] / f"{digest[2:22]}.npy"


def resized_shape(height: int, width: int, imgsz: int) -> tuple[int, int]:
    """(h, w) Ultralytics' loader resizes a ``height`` x ``width`` frame to: its long side to ``imgsz``
    (``BaseDataset.load_image`` with ``rect_mode``; either side at most ``imgsz``)."""
    r = imgsz / max(height, width)
    if r == 1:
        return height, width
    return min(math.ceil(height * r), imgsz), min(math.ceil(width * r), imgsz)


def resize_like_ultralytics(image: np.ndarray, imgsz: int) -> np.ndarray:
    """``image`` as Ultralytics' loader resizes it for training and validation at ``imgsz`` (bilinear; unchanged
    where the long side is ``imgsz`` already). Checked against the loader itself where it is read (sized_frames)."""
    import cv2

    h, w = resized_shape(*image.shape[:2], imgsz)
    if (h, w) == image.shape[:2]:
        return image
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)


SIZED = re.compile(r"^(\d+)_(\d+)x(\d+)\.npy$")


def sized_link(image: Path, imgsz: int) -> Path:
    """The stage's link to the frame stored at ``imgsz``: ``<name>.s<imgsz>.npy`` beside ``image``."""
    return image.with_name(f"{image.stem}.s{int(imgsz)}.npy")


def sized_file(frame_dir: Path, imgsz: int) -> Path | None:
    """The file of the frame whose folder is ``frame_dir`` at ``imgsz``, where one was written."""
    try:
        names = os.listdir(frame_dir)
    except OSError:
        return None
    return next((frame_dir / n for n in names if (m := SIZED.match(n)) and int(m.group(1)) == imgsz), None)


def original_shape(stored: Path) -> tuple[int, int]:
    """(height, width) of the frame before it was resized, from a stored file's name (``<imgsz>_<h>x<w>.npy``)."""
    m = SIZED.match(Path(stored).name)
    if m is None:
        raise ValueError(f"{stored}: not a frame stored at a training size (<imgsz>_<h>x<w>.npy)")
    return int(m.group(2)), int(m.group(3))


def write_npy(path: Path, array: np.ndarray) -> int:
    """``np.save`` through ``io.atomic_path``: readers see no file or all of it; its size in bytes."""
    with io.atomic_path(path) as tmp:
        np.save(tmp, array, allow_pickle=False)
    return path.stat().st_size


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target`` (a symlink made under a temporary name and renamed over any old one)."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.lnk")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def frame_shape(image: Path) -> tuple[int, int] | None:
    """(height, width) of ``image`` from its header; None where the header does not open."""
    from PIL import Image

    try:
        with Image.open(image) as im:
            width, height = im.size
    except Exception:  # any decoder's error (Ultralytics' PIL plugins raise their own)
        return None
    return height, width


def frame_bytes(image: Path, imgsz: int | None = None) -> int:
    """Bytes of ``image`` decoded (3 channels; resized to ``imgsz`` where given), from its header; 0 where the
    header does not open."""
    shape = frame_shape(image)
    if shape is None:
        return 0
    height, width = resized_shape(*shape, imgsz) if imgsz else shape
    return width * height * 3


def link_cached_frames(folders: Iterable[Path], cache: str | Path, workers: int = 1,
                       log: Callable[[str], None] = print, imgsz: int | None = None) -> CacheReport:
    """Give every image of ``folders`` (a stage's ``<split>/images``) a link to its decoded frame in ``cache``,
    decoding the frames not there yet (``workers`` threads): ``<name>.npy`` to the frame as decoded (what
    Ultralytics' loader reads by itself), or with ``imgsz`` ``<name>.s<imgsz>.npy`` to the frame resized as the
    loader resizes it (:func:`sized_link`; read through :mod:`.sized_frames`). With too little free disk for the
    frames still to decode, nothing is written; a frame that does not decode is not cached. Either way the job
    reads those frames as it would without the cache (said in the log)."""
    cache = Path(cache).resolve()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"engine.image_cache: cannot make the folder {cache} ({err})") from err
    sized = int(imgsz) if imgsz else None

    def stored(key: Path) -> Path | None:  # the frame's file, where it was written
        if sized is None:
            return key if key.exists() else None
        return sized_file(key.with_suffix(""), sized)

    # the frames the exports hold (a link to a missing frame is not a file: left to Ultralytics, which names it)
    links = {img: cached_path(cache, img) for folder in folders for img in sorted_images(Path(folder))}
    frames: dict[Path, Path] = {}  # shared key -> one image of it (a frame staged in several folders: once)
    for img, key in links.items():
        frames.setdefault(key, img)
    report = CacheReport()
    files = {key: stored(key) for key in frames}
    todo = [(key, img) for key, img in frames.items() if files[key] is None]
    report.reused = len(frames) - len(todo)
    if todo:
        per_frame = next((b for b in (frame_bytes(img, sized) for _, img in todo) if b), 0)
        need = per_frame * len(todo) * (1 + DISK_MARGIN)
        free = shutil.disk_usage(cache).free
        if need > free:
            report.skipped = (f"{len(todo)} frames need about {need / 2**30:.1f} GiB, {cache} has "
                              f"{free / 2**30:.1f} GiB free: frames decoded as they are read")
            log(f"image cache: {report.skipped}")
            todo = []
        else:
            def store(item: tuple[Path, Path]) -> int:
                key, img = item
                try:
                    array = decode(img)
                except ValueError as err:  # Ultralytics skips or names such a frame itself, as without the cache
                    report.unreadable.append(str(err))
                    return 0
                if sized is not None:
                    height, width = array.shape[:2]
                    key = key.with_suffix("") / f"{sized}_{height}x{width}.npy"
                    array = resize_like_ultralytics(array, sized)
                files[item[0]] = key
                return write_npy(key, array)

            with ThreadPoolExecutor(max(1, int(workers))) as pool:  # OpenCV decodes without the GIL
                report.bytes_written = sum(pool.map(store, todo))
            report.decoded = len(todo) - len(report.unreadable)
            report.unreadable.sort()
    for img, key in links.items():
        target = files.get(key)
        if target is not None and target.exists():
            _link(img.with_suffix(".npy") if sized is None else sized_link(img, sized), target)
    if todo:
        log(f"image cache: {report.decoded} frames decoded into {cache} ({report.bytes_written / 2**30:.2f} GiB), "
            f"{report.reused} already there")
    if report.unreadable:
        log(f"image cache: {len(report.unreadable)} frames not cached (read as without the cache); "
            f"first: {report.unreadable[0]}")
    return report
