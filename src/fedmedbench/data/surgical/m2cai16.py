"""m2cai16-tool-locations (Jin et al., WACV 2018): Pascal VOC, one XML per frame.

Release layout (``<surgical.root>/m2cai16-tool-locations/``)::

    JPEGImages/v01_002075.jpg          frame 2075 of video v01 (frame numbers index the 25 fps
    JPEGImages/v02_042400_flip.jpg     video; frames were annotated at 1 fps), *_flip = a
    Annotations/v01_002075.xml         horizontally flipped augmentation copy
    ImageSets/Main/{train,val,test}.txt  the original FRAME-level splits (they leak: adjacent
                                          frames of one video sit in different splits)

``*_flip`` copies are augmentations, not frames: they are left out (counted in the meta),
because keeping them would put a frame and its mirror image into the index twice.
The original splits are recorded in the ``split`` column; re-curation replaces them
with video-level splits (UltraFlwr, Fig. 1).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from fedmedbench.data.surgical.badfiles import DatasetNotFoundError
from fedmedbench.data.surgical.base import AdapterContext, resolve_fps, timestamp
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
#: frame numbers in the file names index the 25 fps video (annotated frames are 25 apart)
OFFICIAL_FPS = 25.0
#: the release's class names (its class_list.txt), mapped to the canonical tool classes
OFFICIAL_CLASS_MAP = {"Grasper": "grasper", "Bipolar": "bipolar", "Hook": "hook", "Scissors": "scissors",
                      "Clipper": "clipper", "Irrigator": "irrigator", "SpecimenBag": "specimen_bag"}
NAME_RE = re.compile(r"^(?P<video>v\d+)_(?P<frame>\d+)(?P<flip>_flip)?$")


def _split_lists(root) -> dict[str, str]:
    split_of: dict[str, str] = {}
    for split in ("train", "val", "test"):
        path = root / "ImageSets" / "Main" / f"{split}.txt"
        if path.is_file():
            for line in path.read_text().split("\n"):
                if line.strip():
                    split_of.setdefault(line.split()[0], split)
    return split_of


def _class_lookup(ctx: AdapterContext) -> dict[str, str]:
    mapping = ctx.opt("class_map", OFFICIAL_CLASS_MAP)
    lookup = {}
    for src, dst in mapping.items():
        if dst not in TOOL_CLASSES and canonical_tool(dst) is None:
            raise ValueError(f"surgical.datasets.{ctx.name}.class_map: '{dst}' is not a tool class {TOOL_CLASSES}")
        lookup[src.strip().lower()] = canonical_tool(dst) or dst
    return lookup


def _parse_xml(path, lookup, width, height, tol) -> tuple[list[Box] | None, str | None]:
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return None, f"XML does not parse ({exc})"
    size = root.find("size")
    if size is not None and size.findtext("width") and size.findtext("height"):
        try:
            xw, xh = int(float(size.findtext("width"))), int(float(size.findtext("height")))
        except ValueError:
            return None, "XML <size> is not numeric"
        if (xw, xh) != (width, height):
            return None, f"XML size {xw}x{xh} differs from the image size {width}x{height}"
    boxes = []
    for obj in root.iter("object"):
        name = (obj.findtext("name") or "").strip()
        cls = lookup.get(name.lower())
        if cls is None:
            return None, f"label '{name}' is not in the class map {sorted(lookup)}"
        bb = obj.find("bndbox")
        try:
            box = Box(cls, *(float(bb.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax")))
        except (AttributeError, TypeError, ValueError):
            return None, f"object '{name}' has no numeric <bndbox>"
        problem = check_box(box, width, height, tol)
        if problem:
            return None, problem
        boxes.append(clip_box(box, width, height))
    return boxes, None


def index(ctx: AdapterContext) -> tuple[list[dict], dict]:
    img_dir, ann_dir = ctx.root / "JPEGImages", ctx.root / "Annotations"
    for sub in (img_dir, ann_dir):
        if not sub.is_dir():
            raise DatasetNotFoundError(f"surgical dataset '{ctx.name}': {sub} is missing; not the m2cai16-tool-locations "
                                       "layout (JPEGImages/, Annotations/, ImageSets/Main/; see docs/surgical_data.md)")
    fps, fps_source = resolve_fps(ctx, OFFICIAL_FPS, required=True)
    lookup = _class_lookup(ctx)
    tol = float(ctx.opt("box_tolerance_px", 1.0))
    split_of = _split_lists(ctx.root)
    stems = sorted({p.stem for p in img_dir.glob("*.jpg")} | {p.stem for p in ann_dir.glob("*.xml")})
    rows, flipped = [], 0
    for stem in stems:
        m = NAME_RE.match(stem)
        if m is None:
            ctx.bad.add(img_dir / f"{stem}.jpg", "file name does not match v<video>_<frame>[_flip]")
            continue
        if m["flip"]:
            flipped += 1
            continue
        video, frame = m["video"], int(m["frame"])
        img, xml = img_dir / f"{stem}.jpg", ann_dir / f"{stem}.xml"
        if not xml.is_file():
            ctx.bad.add(img, "no annotation XML for this image", video, frame)
            continue
        size = image_size(img)
        if size is None:
            ctx.bad.add(img, "image missing or unreadable", video, frame)
            continue
        boxes, problem = _parse_xml(xml, lookup, *size, tol)
        if problem:
            ctx.bad.add(xml, problem, video, frame)
            continue
        rows.append({"dataset": ctx.name, "video_id": video, "frame": frame, "timestamp_s": timestamp(frame, fps),
                     "image_path": str(img), "width": size[0], "height": size[1], "split": split_of.get(stem, ""),
                     "labelled": True, "boxes": dump_boxes(boxes), "mask_path": ""})
    if flipped:
        ctx.notes.append(f"{flipped} *_flip augmentation copies left out")
    return rows, {"task": TASK, "classes": list(TOOL_CLASSES), "fps": fps, "fps_source": fps_source,
                  "split_source": "ImageSets/Main (frame-level, original release)"}
