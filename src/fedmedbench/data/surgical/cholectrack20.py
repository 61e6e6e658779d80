"""CholecTrack20 (Nwoye et al., CVPR 2025): one JSON of tool boxes per video.

Release layout, from the dataset's README and its "Data Structure" figure
(github.com/CAMMA-public/cholectrack20) and the released label files::

    CholecTrack20/
      Training/VID02/VID02.json        labels of the whole video
                    /Frames/000001.png  1 fps frames; the number is the 25 fps frame index
                    /Frames/000026.png  (the official loader opens "{frame:06d}.png")
                    /VID02.mp4          raw video (not used)
      Validation/VID110/...
      Testing/VID01/...

The JSON is ``{"info": {..., "bbox format": "tlwh = [top_left_x, top_left_y, box_width,
box_height]"}, "categories": {"tools": {id: name}, ...}, "video": {"seq", "split", "width",
"height", "num_frames"}, "annotations": {"<frame id>": [{"instrument": 0..6, "tool_bbox":
[x, y, w, h], ...}, ...]}}``. In the released files ``tool_bbox`` is normalised by the image
size (``bbox_normalized: true``, the default). Tool ids follow the release order grasper,
bipolar, hook, scissors, clipper, irrigator, specimen bag (its DetEval code); a
``categories.tools`` table in the JSON takes precedence.

Assumptions (documented in docs/surgical_data.md): a frame image without a key in
``annotations`` shows no tool (``unannotated_frames: background``; ``skip`` leaves such
frames out); the frame rate is the JSON's ``video.fps`` when present, else the configured
``fps``, else the documented 25 fps.
"""

from __future__ import annotations

import json
import math

from fedmedbench.data.surgical.base import AdapterContext, resolve_fps, split_folders, timestamp
from fedmedbench.data.surgical.fsutil import image_size
from fedmedbench.data.surgical.schema import (
    TOOL_CLASSES,
    Box,
    canonical_tool,
    check_box,
    clip_box,
    dump_boxes,
)

TASK = "detection"
OFFICIAL_FPS = 25.0
OFFICIAL_SPLIT_DIRS = {"Training": "train", "Validation": "val", "Testing": "test"}


def _structure_problem(doc) -> str | None:
    """What is wrong with the shape of a label JSON (the field named), or None."""
    if not isinstance(doc, dict):
        return f"the top level is a {type(doc).__name__}, expected an object"
    if not isinstance(doc.get("annotations"), dict):
        return "field 'annotations' is missing or not an object {frame: [records]}"
    for key, records in doc["annotations"].items():
        if records is not None and (not isinstance(records, list) or not all(isinstance(r, dict) for r in records)):
            return f"field 'annotations.{key}' is not a list of objects"
    video = doc.get("video")
    if video is not None and not isinstance(video, dict):
        return "field 'video' is not an object"
    for key in ("width", "height"):
        v = (video or {}).get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            return f"field 'video.{key}' = {v!r} is not a positive integer"
    categories = doc.get("categories")
    if categories is not None and not isinstance(categories, dict):
        return "field 'categories' is not an object"
    return None


def _json_fps(value) -> float | None:
    """A JSON frame rate as the config's is validated: a finite number > 0 (else None)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _tool_table(doc: dict, ctx: AdapterContext) -> dict[int, str]:
    configured = ctx.options.get("class_map")
    if configured:
        return {int(k): canonical_tool(v) or v for k, v in configured.items()}
    tools = (doc.get("categories") or {}).get("tools")
    if isinstance(tools, dict) and tools:
        table = {}
        for k, v in tools.items():
            cls = canonical_tool(v)
            if cls is not None:
                table[int(k)] = cls
        if table:
            return table
    return dict(enumerate(TOOL_CLASSES))


def _boxes(records, table, width, height, normalized, tol) -> tuple[list[Box] | None, str | None]:
    boxes = []
    for rec in records:
        cid = rec.get("instrument", rec.get("category"))
        if isinstance(cid, bool) or not isinstance(cid, int | str) or not str(cid).lstrip("-").isdigit():
            return None, f"field 'instrument' = {cid!r} is not an integer tool id"
        if int(cid) not in table:
            return None, f"instrument id {cid!r} is not in the tool map {sorted(table)}"
        try:
            x, y, w, h = (float(v) for v in rec["tool_bbox"])
        except (KeyError, TypeError, ValueError):
            return None, "record without a numeric tool_bbox [x, y, w, h]"
        if normalized:
            if max(x, y, x + w, y + h) > 1.0 + 1e-6 or min(x, y) < -1e-6:
                return None, f"normalised tool_bbox {[x, y, w, h]} outside [0, 1] (box outside the image)"
            x, y, w, h = x * width, y * height, w * width, h * height
        box = Box(table[int(cid)], x, y, x + w, y + h)
        problem = check_box(box, width, height, tol)
        if problem:
            return None, problem
        boxes.append(clip_box(box, width, height))
    return boxes, None


def _video(ctx, vdir, split, fps_cfg, tol, normalized, frames_dir, ext, unannotated) -> list[dict]:
    vid = vdir.name
    label = vdir / f"{vid}.json"
    if not label.is_file():
        candidates = sorted(vdir.glob("*.json"))
        if len(candidates) != 1:
            ctx.bad.add(label, f"no label JSON ({len(candidates)} *.json files in the video folder)", vid)
            return []
        label = candidates[0]
    try:
        doc = json.loads(label.read_text())
        problem = _structure_problem(doc)
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"JSON does not parse ({exc})"
    if problem:
        ctx.bad.add(label, f"not a CholecTrack20 label file: {problem}", vid)
        return []
    annotations = doc["annotations"]
    video = doc.get("video") or {}
    fps = fps_cfg
    if video.get("fps") is not None:
        fps = _json_fps(video["fps"])
        if fps is None:
            ctx.bad.add(label, f"field 'video.fps' = {video['fps']!r} is not a positive frame rate", vid)
            return []
        ctx.notes.append(f"{vid}: fps {fps} read from its JSON")
    try:
        table = _tool_table(doc, ctx)
    except (TypeError, ValueError) as exc:
        ctx.bad.add(label, f"field 'categories.tools' is not a map of integer ids to names ({exc})", vid)
        return []
    frames: dict[int, list] = {}
    for key, records in annotations.items():
        try:
            frames[int(key)] = records or []
        except ValueError:
            ctx.bad.add(label, f"annotation key '{key}' is not a frame number", vid)
    fdir = vdir / frames_dir
    on_disk = {int(p.stem): p for p in fdir.glob(f"*{ext}") if p.stem.isdigit()} if fdir.is_dir() else {}
    if unannotated == "background":
        for f in on_disk:
            frames.setdefault(f, [])
    rows = []
    for frame in sorted(frames):
        img = on_disk.get(frame, fdir / f"{frame:06d}{ext}")
        size = image_size(img)
        if size is None:
            ctx.bad.add(img, "image missing or unreadable", vid, frame)
            continue
        if video.get("width") and video.get("height") and (int(video["width"]), int(video["height"])) != size:
            ctx.bad.add(img, f"image size {size[0]}x{size[1]} differs from the JSON video size "
                             f"{video['width']}x{video['height']}", vid, frame)
            continue
        boxes, problem = _boxes(frames[frame], table, *size, normalized, tol)
        if problem:
            ctx.bad.add(label, f"frame {frame}: {problem}", vid, frame)
            continue
        rows.append({"dataset": ctx.name, "video_id": vid, "frame": frame, "timestamp_s": timestamp(frame, fps),
                     "image_path": str(img), "width": size[0], "height": size[1], "split": split, "labelled": True,
                     "boxes": dump_boxes(boxes), "mask_path": ""})
    return rows


def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    present = split_folders(ctx, OFFICIAL_SPLIT_DIRS, "CholecTrack20")
    fps, fps_source = resolve_fps(ctx, OFFICIAL_FPS, required=True)
    tol = float(ctx.opt("box_tolerance_px", 1.0))
    normalized = bool(ctx.opt("bbox_normalized", True))
    frames_dir = ctx.opt("frames_dir", "Frames")
    ext = ctx.opt("frame_ext", ".png")
    unannotated = ctx.opt("unannotated_frames", "background")
    rows = []
    for d, split in sorted(present.items()):
        for vdir in sorted(p for p in (ctx.root / d).iterdir() if p.is_dir()):
            rows += _video(ctx, vdir, split, fps, tol, normalized, frames_dir, ext, unannotated)
    return rows, {"task": TASK, "classes": list(TOOL_CLASSES), "fps": fps, "fps_source": fps_source,
                  "split_source": f"release folders {present}", "bbox_normalized": normalized,
                  "unannotated_frames": unannotated}
