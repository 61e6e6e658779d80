"""Generic COCO detection folder of video frames.

Expected layout (``<surgical.root>/<folder>/``)::

    annotations/<split>.json  or  annotations/instances_<split>.json   (split = train | val | test)
    images/<split>/<file_name>  or  images/<file_name>

Each JSON has ``images`` (``id``, ``file_name``, ``width``, ``height``, optional
``video_id``/``video`` and ``frame_id``/``frame_index``), ``annotations`` (``image_id``,
``category_id``, ``bbox`` = [x, y, w, h] in pixels) and ``categories`` (``id``, ``name``).
Without video fields the video and frame come from the file stem through
``video_regex``. Class names go through ``class_map`` as for the YOLO folder.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePath, PureWindowsPath

from fedmedbench.data.surgical.badfiles import DatasetNotFoundError
from fedmedbench.data.surgical.base import AdapterContext, resolve_fps, timestamp
from fedmedbench.data.surgical.fsutil import image_size
from fedmedbench.data.surgical.schema import SPLITS, Box, check_box, clip_box, dump_boxes
from fedmedbench.data.surgical.yolo_folder import DEFAULT_VIDEO_REGEX, class_names

TASK = "detection"


def _annotation_files(root) -> dict[str, Path]:
    out = {}
    for split in SPLITS:
        for name in (f"{split}.json", f"instances_{split}.json"):
            if (root / "annotations" / name).is_file():
                out[split] = root / "annotations" / name
                break
    return out


def _video_frame(img: dict, regex) -> tuple[str, int] | None:
    video = img.get("video_id", img.get("video"))
    frame = img.get("frame_id", img.get("frame_index"))
    if video is not None and frame is not None:
        return str(video), int(frame)
    m = regex.match(Path(img["file_name"]).stem)
    return (m["video"], int(m["frame"])) if m else None


def _outside_dataset(root: Path, name) -> str | None:
    """Why a COCO ``file_name`` would read an image from outside the dataset folder (absolute, or climbing out
    with ``..``); None when it stays inside. Checked on the path's text: links inside the folder still work."""
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if PurePath(name).is_absolute() or PureWindowsPath(name).drive:
        return "is an absolute path"
    inside = os.path.normpath(root / "images" / "x" / name)
    if not inside.startswith(str(root) + os.sep):
        return "climbs out of the dataset folder"
    return None


def _split(ctx, split, path, regex, fps, tol, all_classes) -> list[dict]:
    try:
        doc = json.loads(path.read_text())
        cats = {int(c["id"]): str(c["name"]) for c in doc["categories"]}
        images, anns = doc["images"], doc["annotations"]
    except (ValueError, KeyError, TypeError) as exc:
        ctx.bad.add(path, f"JSON does not parse as COCO ({exc})")
        return []
    names = dict(zip(cats, class_names(ctx, list(cats.values())), strict=True))
    for n in names.values():
        if n not in all_classes:
            all_classes.append(n)
    by_image: dict[int, list] = {}
    for a in anns:
        by_image.setdefault(int(a.get("image_id", -1)), []).append(a)
    rows = []
    for img in sorted(images, key=lambda i: str(i.get("file_name"))):
        outside = _outside_dataset(ctx.root, img.get("file_name"))
        if outside:
            ctx.bad.add(path, f"image file_name {img.get('file_name')!r} {outside}; file names are relative to "
                              f"{ctx.root / 'images'}")
            continue
        vf = _video_frame(img, regex)
        file = next((p for p in (ctx.root / "images" / split / img["file_name"], ctx.root / "images" / img["file_name"])
                     if p.is_file()), ctx.root / "images" / split / img["file_name"])
        if vf is None:
            ctx.bad.add(file, f"no video/frame fields and the file name does not match video_regex {regex.pattern!r}")
            continue
        vid, frame = vf
        size = image_size(file)
        if size is None:
            ctx.bad.add(file, "image missing or unreadable", vid, frame)
            continue
        boxes, problem = [], None
        for a in by_image.get(int(img["id"]), []):
            cid = int(a.get("category_id", -1))
            if cid not in names:
                problem = f"category_id {cid} not in categories {sorted(names)}"
                break
            try:
                x, y, w, h = (float(v) for v in a["bbox"])
            except (KeyError, TypeError, ValueError):
                problem = f"annotation {a.get('id')} has no numeric bbox [x, y, w, h]"
                break
            box = Box(names[cid], x, y, x + w, y + h)
            problem = check_box(box, *size, tol)
            if problem:
                break
            boxes.append(clip_box(box, *size))
        if problem:
            ctx.bad.add(path, f"image {img['file_name']}: {problem}", vid, frame)
            continue
        rows.append({"dataset": ctx.name, "video_id": vid, "frame": frame, "timestamp_s": timestamp(frame, fps),
                     "image_path": str(file), "width": size[0], "height": size[1], "split": split,
                     "labelled": True, "boxes": dump_boxes(boxes), "mask_path": ""})
    return rows


def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    files = _annotation_files(ctx.root)
    if not files:
        raise DatasetNotFoundError(f"surgical dataset '{ctx.name}': no annotations/<split>.json in {ctx.root}; "
                                   "not a COCO folder (see docs/surgical_data.md)")
    fps, fps_source = resolve_fps(ctx, None, required=False)
    regex = re.compile(ctx.opt("video_regex", DEFAULT_VIDEO_REGEX))
    tol = float(ctx.opt("box_tolerance_px", 1.0))
    rows, classes = [], []
    for split, path in files.items():
        rows += _split(ctx, split, path, regex, fps, tol, classes)
    return rows, {"task": TASK, "classes": classes, "fps": fps, "fps_source": fps_source,
                  "split_source": f"COCO files {sorted(files)}"}
