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
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedmedbench import io
from fedmedbench.data.surgical.fsutil import sorted_images

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


def frame_bytes(image: Path) -> int:
    """Bytes of ``image`` decoded (3 channels), from its header; 0 where the header does not open."""
    from PIL import Image

    try:
        with Image.open(image) as im:
            width, height = im.size
    except Exception:  # any decoder's error (Ultralytics' PIL plugins raise their own)
        return 0
    return width * height * 3


def link_cached_frames(folders: Iterable[Path], cache: str | Path, workers: int = 1,
                       log: Callable[[str], None] = print) -> CacheReport:
    """Give every image of ``folders`` (a stage's ``<split>/images``) a ``<name>.npy`` link to its decoded
    frame in ``cache``, decoding the frames not there yet (``workers`` threads). With too little free disk
    for the frames still to decode, nothing is written; a frame that does not decode is not cached. Either
    way the job reads those frames as it would without the cache (said in the log)."""
    cache = Path(cache).resolve()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"engine.image_cache: cannot make the folder {cache} ({err})") from err
    # the frames the exports hold (a link to a missing frame is not a file: left to Ultralytics, which names it)
    links = {img: cached_path(cache, img) for folder in folders for img in sorted_images(Path(folder))}
    frames: dict[Path, Path] = {}  # shared file -> one image of it (a frame staged in several folders: once)
    for img, npy in links.items():
        frames.setdefault(npy, img)
    report = CacheReport()
    todo = [(npy, img) for npy, img in frames.items() if not npy.exists()]
    report.reused = len(frames) - len(todo)
    if todo:
        per_frame = next((b for b in (frame_bytes(img) for _, img in todo) if b), 0)
        need = per_frame * len(todo) * (1 + DISK_MARGIN)
        free = shutil.disk_usage(cache).free
        if need > free:
            report.skipped = (f"{len(todo)} frames need about {need / 2**30:.1f} GiB, {cache} has "
                              f"{free / 2**30:.1f} GiB free: frames decoded as they are read")
            log(f"image cache: {report.skipped}")
            todo = []
        else:
            def store(item: tuple[Path, Path]) -> int:
                try:
                    array = decode(item[1])
                except ValueError as err:  # Ultralytics skips or names such a frame itself, as without the cache
                    report.unreadable.append(str(err))
                    return 0
                return write_npy(item[0], array)

            with ThreadPoolExecutor(max(1, int(workers))) as pool:  # OpenCV decodes without the GIL
                report.bytes_written = sum(pool.map(store, todo))
            report.decoded = len(todo) - len(report.unreadable)
            report.unreadable.sort()
    for img, npy in links.items():
        if npy.exists():
            _link(img.with_suffix(".npy"), npy)
    if todo:
        log(f"image cache: {report.decoded} frames decoded into {cache} ({report.bytes_written / 2**30:.2f} GiB), "
            f"{report.reused} already there")
    if report.unreadable:
        log(f"image cache: {len(report.unreadable)} frames not cached (read as without the cache); "
            f"first: {report.unreadable[0]}")
    return report
