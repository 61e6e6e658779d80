"""Generic YOLO detection folder (Ultralytics / Roboflow export) of video frames.

Expected layout (``<surgical.root>/<folder>/``), either arrangement::

    data.yaml                         names: [grasper, ...] or {0: grasper, ...}
    images/<split>/<video>_<frame>.jpg     or   <split>/images/<video>_<frame>.jpg
    labels/<split>/<video>_<frame>.txt     or   <split>/labels/<video>_<frame>.txt

``split`` is train, val (``valid`` accepted) or test. Each label line is ``class xc yc w h``
normalised by the image size; an image without a label file has no tool (YOLO's
convention). Video and frame come from the file stem through ``video_regex`` (named
groups ``video`` and ``frame``); a stem that does not match is a bad file, because frames
of unknown videos cannot be split by video. Class names go through ``class_map``
(default: the canonical tool name when it is one of the seven, else the name as is).
"""

from __future__ import annotations

import re

import yaml

from fedmedbench.data.surgical.badfiles import BadFileError, DatasetNotFoundError
from fedmedbench.data.surgical.base import AdapterContext, resolve_fps, timestamp
from fedmedbench.data.surgical.fsutil import image_size, sorted_images
from fedmedbench.data.surgical.schema import Box, canonical_tool, check_box, clip_box, dump_boxes

TASK = "detection"
DEFAULT_VIDEO_REGEX = r"^(?P<video>.+)_(?P<frame>\d+)$"
SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "test": "test"}


def class_names(ctx: AdapterContext, names) -> list[str]:
    """Release names -> index class names (canonical tool names where they match)."""
    mapping = ctx.opt("class_map", {})
    return [mapping.get(n) or canonical_tool(n) or str(n) for n in names]


def _names(path) -> list[str]:
    """``names`` of data.yaml: a list of strings, or a dict {0: name, 1: name, ...} (Ultralytics' two forms)."""
    try:
        doc = yaml.safe_load(path.read_text())
        names = doc["names"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise BadFileError(f"{path}: no readable 'names' field ({type(exc).__name__}: {exc})") from exc
    if isinstance(names, dict):
        keys = list(names)
        if not all(isinstance(k, int) or (isinstance(k, str) and k.isdigit()) for k in keys):
            raise BadFileError(f"{path}: field 'names' has non-integer class ids {[k for k in keys if not str(k).isdigit()]}; "
                               "expected {0: name, 1: name, ...}")
        ids = sorted(int(k) for k in keys)
        if ids != list(range(len(ids))):
            raise BadFileError(f"{path}: field 'names' class ids {ids} are not 0..{len(ids) - 1}")
        names = [names[k] for k in sorted(keys, key=int)]
    elif not isinstance(names, list):
        raise BadFileError(f"{path}: field 'names' is a {type(names).__name__} ({names!r}); expected a list of class "
                           "names or a dict {0: name, ...} (a single class is written [name])")
    bad = [n for n in names if not isinstance(n, str) or not n.strip()]
    if bad or not names:
        raise BadFileError(f"{path}: field 'names' must hold non-empty class name strings, got {names!r}")
    return list(names)


def _split_folders(root):
    out = {}
    for name, split in SPLIT_NAMES.items():
        if (root / "images" / name).is_dir():
            out[split] = (root / "images" / name, root / "labels" / name)
        elif (root / name / "images").is_dir():
            out[split] = (root / name / "images", root / name / "labels")
    return out


def _label_boxes(path, names, width, height, tol) -> tuple[list[Box] | None, str | None]:
    if not path.is_file():
        return [], None
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        return None, f"not a readable text label file ({type(exc).__name__})"
    if "\x00" in text:
        return None, "not a text label file (binary content)"
    boxes = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            return None, f"line {n}: expected 'class xc yc w h', got {len(parts)} fields"
        try:
            cid = int(parts[0])
            xc, yc, w, h = (float(v) for v in parts[1:])
        except ValueError:
            return None, f"line {n}: not numeric"
        if not 0 <= cid < len(names):
            return None, f"line {n}: class id {cid} not in the {len(names)} names of data.yaml"
        box = Box(names[cid], (xc - w / 2) * width, (yc - h / 2) * height, (xc + w / 2) * width, (yc + h / 2) * height)
        problem = check_box(box, width, height, tol)
        if problem:
            return None, f"line {n}: {problem}"
        boxes.append(clip_box(box, width, height))
    return boxes, None


def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    data_yaml = ctx.root / "data.yaml"
    folders = _split_folders(ctx.root)
    if not data_yaml.is_file() or not folders:
        raise DatasetNotFoundError(f"surgical dataset '{ctx.name}': {ctx.root} is not a YOLO folder "
                                   "(needs data.yaml and images/<split>/ or <split>/images/; see docs/surgical_data.md)")
    names = class_names(ctx, _names(data_yaml))
    fps, fps_source = resolve_fps(ctx, None, required=False)
    regex = re.compile(ctx.opt("video_regex", DEFAULT_VIDEO_REGEX))
    tol = float(ctx.opt("box_tolerance_px", 1.0))
    rows = []
    for split, (img_dir, lab_dir) in sorted(folders.items()):
        images = sorted_images(img_dir)
        stems = {p.stem for p in images}
        for orphan in sorted(lab_dir.glob("*.txt")) if lab_dir.is_dir() else []:
            if orphan.stem not in stems:
                ctx.bad.add(orphan, "label file without an image")
        for img in images:
            m = regex.match(img.stem)
            if m is None:
                ctx.bad.add(img, f"file name does not match video_regex {regex.pattern!r}")
                continue
            vid, frame = m["video"], int(m["frame"])
            size = image_size(img)
            if size is None:
                ctx.bad.add(img, "image missing or unreadable", vid, frame)
                continue
            label = lab_dir / f"{img.stem}.txt"
            boxes, problem = _label_boxes(label, names, *size, tol)
            if problem:
                ctx.bad.add(label, problem, vid, frame)
                continue
            rows.append({"dataset": ctx.name, "video_id": vid, "frame": frame, "timestamp_s": timestamp(frame, fps),
                         "image_path": str(img), "width": size[0], "height": size[1], "split": split,
                         "labelled": True, "boxes": dump_boxes(boxes), "mask_path": ""})
    return rows, {"task": TASK, "classes": names, "fps": fps, "fps_source": fps_source,
                  "split_source": f"YOLO split folders {sorted(folders)}"}
