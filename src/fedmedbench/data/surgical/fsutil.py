"""Folder-level helpers: atomic output folders, dataset folder lookup, image and mask reading."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

from fedmedbench.data.surgical.badfiles import DatasetNotFoundError
from fedmedbench.workflow.io import naming_full_disk

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp folder next to ``target``; it replaces ``target`` only if the block succeeds.

    A killed or failing job leaves no half-written output folder (Snakemake ``directory()``
    outputs appear complete or not at all); a full disk names the output folder.
    """
    target = Path(target)
    with naming_full_disk(target, "folder"):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        with naming_full_disk(target, "folder"):  # not the temp folder's name: the output's
            yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def dataset_dir(root: str | os.PathLike | None, folder: str, name: str, root_key: str = "surgical.root") -> Path:
    """The folder of one dataset, or a clear error naming the dataset and where it was looked for."""
    if root is None:
        raise DatasetNotFoundError(
            f"surgical dataset '{name}': {root_key} is not set. Place the licensed release in "
            f"<{root_key}>/{folder}/ and set {root_key} (see docs/surgical_data.md), "
            "or use surgical.origin: synthetic for the demo data."
        )
    path = Path(root) / folder
    if not path.is_dir():
        raise DatasetNotFoundError(
            f"surgical dataset '{name}' not found: looked for the folder {path.resolve()} "
            f"({root_key}={root}, surgical.datasets.{name}.folder={folder}). These datasets are licensed and "
            "cannot be downloaded automatically: see docs/surgical_data.md for where to get it and the expected layout."
        )
    return path.resolve()


def read_image(path: Path) -> np.ndarray | None:
    """Decode an image (BGR or grey) with OpenCV; None when the file is unreadable."""
    if not path.is_file():
        return None
    data = np.fromfile(str(path), dtype=np.uint8)
    if data.size == 0:
        return None
    return cv2.imdecode(data, cv2.IMREAD_UNCHANGED)


def image_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of a decodable image, None when unreadable (the whole file is decoded on purpose:
    a truncated JPEG/PNG has a valid header but fails here)."""
    img = read_image(path)
    if img is None:
        return None
    return int(img.shape[1]), int(img.shape[0])


def write_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".png", array)
    if not ok:
        raise OSError(f"{path}: PNG encoding failed")
    buf.tofile(str(path))


def write_jpg(path: Path, array: np.ndarray, quality: int = 95) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".jpg", array, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise OSError(f"{path}: JPEG encoding failed")
    buf.tofile(str(path))


def sorted_images(folder: Path) -> list[Path]:
    """Image files of a folder in a stable order (never rely on os.listdir order)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
