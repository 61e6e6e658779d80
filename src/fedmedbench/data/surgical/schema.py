"""The internal frame index every surgical adapter produces, and the canonical class lists.

One row per frame. Detection datasets fill ``boxes``; segmentation datasets fill
``mask_path`` (a canonical mask written by the adapter, pixel value = index into the
dataset's class list). Downstream code (re-curation, YOLO export, clip export, the
``ultraflwr`` and ``fedst`` studies) reads only this table and ``meta.json``, never a
dataset's own layout.

Columns (``INDEX_COLUMNS``):

=============  ========  ==========================================================
column         dtype     meaning
=============  ========  ==========================================================
dataset        str       dataset key in ``surgical.datasets``
video_id       str       video (procedure) id as named by the release (``v01``, ``VID12``)
frame          int64     frame number in the video, as in the release's file names
timestamp_s    float64   ``frame / fps``; NaN when the dataset has no configured fps
image_path     str       absolute path of the frame image
width, height  int64     image size in pixels (read from the file)
split          str       the release's own split (``train``/``val``/``test``) or ``""``
labelled       bool      False for history-only frames (no mask) of segmentation sets
boxes          str       JSON ``[[class, x1, y1, x2, y2], ...]`` in pixels; ``"[]"`` when
                         the frame has no tool; ``""`` for segmentation datasets
mask_path      str       canonical mask (uint8 PNG) or ``""``
=============  ========  ==========================================================
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

#: The seven laparoscopic tool classes of m2cai16-tool-locations and CholecTrack20, in release order.
TOOL_CLASSES = ("grasper", "bipolar", "hook", "scissors", "clipper", "irrigator", "specimen_bag")
#: Part segmentation classes (FedST: shaft, wrist and jaws; EndoVis calls the jaws "clasper").
PART_CLASSES = ("background", "shaft", "wrist", "clasper")
#: Binary instrument segmentation (e.g. GraSP).
BINARY_CLASSES = ("background", "instrument")
LABEL_SETS = {"parts": PART_CLASSES, "binary": BINARY_CLASSES}

INDEX_COLUMNS = ("dataset", "video_id", "frame", "timestamp_s", "image_path", "width", "height", "split",
                 "labelled", "boxes", "mask_path")
SPLITS = ("train", "val", "test")


def normalize_name(name: str) -> str:
    """Compare class names across releases: ``SpecimenBag`` == ``specimen-bag`` == ``specimen_bag``."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def canonical_tool(name: str) -> str | None:
    """The canonical tool class for a release's name, or None when it is not one of the seven."""
    key = normalize_name(name)
    for cls in TOOL_CLASSES:
        if normalize_name(cls) == key:
            return cls
    return None


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in pixels (x1, y1) top-left, (x2, y2) bottom-right, exclusive of nothing."""

    cls: str
    x1: float
    y1: float
    x2: float
    y2: float

    def as_list(self) -> list:
        return [self.cls, round(self.x1, 3), round(self.y1, 3), round(self.x2, 3), round(self.y2, 3)]


def dump_boxes(boxes: list[Box]) -> str:
    return json.dumps([b.as_list() for b in boxes], separators=(",", ":"))


def parse_boxes(text: str) -> list[Box]:
    """Boxes of one index row (``[]`` for a frame without tools or a segmentation row)."""
    if not text:
        return []
    return [Box(str(c), float(a), float(b), float(x), float(y)) for c, a, b, x, y in json.loads(text)]


def check_box(box: Box, width: int, height: int, tolerance: float) -> str | None:
    """Why a box is invalid for an image of this size (None when it is fine)."""
    if not (box.x2 > box.x1 and box.y2 > box.y1):
        return f"degenerate box {box.as_list()}"
    if box.x1 < -tolerance or box.y1 < -tolerance or box.x2 > width + tolerance or box.y2 > height + tolerance:
        return f"box {box.as_list()} outside the {width}x{height} image"
    return None


def clip_box(box: Box, width: int, height: int) -> Box:
    """Clamp a box that passed :func:`check_box` (within the tolerance) to the image."""
    return Box(box.cls, max(0.0, box.x1), max(0.0, box.y1), min(float(width), box.x2), min(float(height), box.y2))


def empty_index() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=_DTYPES[c]) for c in INDEX_COLUMNS})


_DTYPES = {"dataset": "object", "video_id": "object", "frame": "int64", "timestamp_s": "float64",
           "image_path": "object", "width": "int64", "height": "int64", "split": "object", "labelled": "bool",
           "boxes": "object", "mask_path": "object"}


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows (dicts with every index column) -> a typed index, sorted by video and frame."""
    if not rows:
        return empty_index()
    df = pd.DataFrame(rows, columns=list(INDEX_COLUMNS))
    df = df.astype(_DTYPES)
    return df.sort_values(["dataset", "video_id", "frame", "image_path"], kind="stable").reset_index(drop=True)


def validate_index(df: pd.DataFrame, where: str) -> None:
    """Structural checks every adapter's output must pass (missing column, duplicate frame)."""
    missing = [c for c in INDEX_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: index lacks columns {missing}")
    dup = df.duplicated(["dataset", "video_id", "frame"], keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        raise ValueError(f"{where}: frame {first['frame']} of video {first['video_id']} appears twice "
                         f"({', '.join(df[dup]['image_path'].head(2))})")


def read_index(index_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """Load an index folder written by ``index_surgical`` (``index.parquet`` + ``meta.json``)."""
    index_dir = Path(index_dir)
    path = index_dir / "index.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: surgical index not found (run the index_surgical rule)")
    meta = json.loads((index_dir / "meta.json").read_text())
    df = pd.read_parquet(path)
    return df.astype(_DTYPES), meta
