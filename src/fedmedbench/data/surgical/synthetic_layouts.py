"""Write synthetic surgical videos in the REAL on-disk layouts, so the demo runs the same adapters as real data.

One writer per layout (m2cai16 VOC, CholecTrack20 JSON, EndoVis2017 per-instrument part
masks, EndoVis2018 colour-coded scene labels, generic frames+masks for the other sites
and the simulator set). ``spec`` is one entry of ``surgical.synthetic.datasets``:

* ``style``: a preset of :data:`fedmedbench.data.surgical.synthetic.STYLES`
* ``videos``: training videos (m2cai16: all videos; CholecTrack20: ignored, the release's
  20 video ids and split folders are used)
* ``val_videos``, ``test_videos``: frames+masks, EndoVis (test folders) only
* ``frames`` [min, max]: frames per video; ``test_frames`` [min, max] for test videos
* ``label_every``: frames+masks only; frames in between get no mask (history-only frames)
* ``tool_scale``: m2cai16/CholecTrack20 only: tools (and their boxes) drawn this much larger
* ``width``, ``height``: this dataset's frame size (default: ``surgical.synthetic``'s)
* ``distinct_frames``: render at most this many frames per video and repeat them in turn for the
  rest, each repeat a hard link to the first file written from the same frame (videos at a
  release's full frame count and resolution without rendering or storing every frame, for timing;
  the content repeats, so such a set is for cost measurements, never for learning curves)
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedmedbench.data.surgical import cholectrack20 as ct20
from fedmedbench.data.surgical import endovis2018 as ev18
from fedmedbench.data.surgical import fsutil
from fedmedbench.data.surgical import m2cai16 as m2
from fedmedbench.data.surgical.facts import FRAME_RATES, frame_rate
from fedmedbench.data.surgical.fsutil import atomic_dir
from fedmedbench.data.surgical.schema import TOOL_CLASSES
from fedmedbench.data.surgical.synthetic import (
    STYLES,
    Frame,
    Style,
    Track,
    detection_tracks,
    render_video,
    rng_for,
    segmentation_tracks,
)

#: CholecTrack20 video ids per release split folder (as in public copies of the release)
CHOLECTRACK20_VIDEOS = {
    "Training": ["VID02", "VID04", "VID11", "VID13", "VID17", "VID23", "VID31", "VID37", "VID96", "VID103"],
    "Validation": ["VID30", "VID110"],
    "Testing": ["VID01", "VID06", "VID07", "VID12", "VID25", "VID39", "VID92", "VID111"],
}
ENDOVIS17_NAMES = {"grasper": "Prograsp_Forceps", "bipolar": "Maryland_Bipolar_Forceps",
                   "scissors": "Monopolar_Curved_Scissors"}
SPLIT_WORD = {"Training": "training", "Validation": "validation", "Testing": "testing"}


def _n_frames(rng, spec: dict, key: str = "frames") -> int:
    lo, hi = spec.get(key) or spec.get("frames") or [6, 6]
    return int(rng.integers(int(lo), int(hi) + 1))


def _style(spec: dict):
    try:
        return STYLES[spec["style"]]
    except KeyError:
        raise ValueError(f"unknown synthetic style '{spec.get('style')}'; known: {sorted(STYLES)}") from None


# --- repeated frames (``distinct_frames``) ------------------------------------------------------

#: while a dataset with ``distinct_frames`` is written: (id of a frame-owned array, suffix) -> (the array,
#: the first file written from it); holding the array keeps its id from being reused by another object
_written: dict[tuple[int, str], tuple[np.ndarray, Path | None]] | None = None


@contextmanager
def _linking(active: bool):
    global _written
    _written = {} if active else None
    try:
        yield
    finally:
        _written = None


def _write(path: Path, array: np.ndarray) -> None:
    """Encode ``array`` to ``path`` (PNG or JPEG by suffix); a repeated frame's array becomes a hard link."""
    entry = _written.get((id(array), path.suffix)) if _written is not None else None
    own = entry is not None and entry[0] is array
    if own and entry[1] is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.link(entry[1], path)
        return
    (fsutil.write_jpg if path.suffix == ".jpg" else fsutil.write_png)(path, array)
    if own:  # the first file of a frame that repeats
        _written[(id(array), path.suffix)] = (array, path)


def _video(rng: np.random.Generator, spec: dict, style: Style, n: int, width: int, height: int, dt: float,
           tracks_of: Callable[..., list[Track]], **render) -> tuple[list[Frame], list[Track]]:
    """``n`` frames of one video and its tools (``tracks_of(rng, width, height, count, dt)``): all frames
    rendered, or with ``distinct_frames`` K the first K, repeated in turn."""
    k = int(spec.get("distinct_frames") or 0)
    count = k if 0 < k < n else n
    tracks = tracks_of(rng, width, height, count, dt)
    frames = render_video(rng, style, count, width, height, dt, tracks, **render)
    if count == n:
        return frames, tracks
    if _written is not None:
        _written.clear()  # the previous video's frames are written: only this video's can repeat
        for fr in frames:
            for arr in (fr.image, fr.parts):
                for suffix in (".png", ".jpg"):
                    _written[(id(arr), suffix)] = (arr, None)
    return [frames[i % k] for i in range(n)], tracks


def _voc_xml(stem: str, w: int, h: int, boxes) -> bytes:
    official = {v: k for k, v in m2.OFFICIAL_CLASS_MAP.items()}
    root = ET.Element("annotation")
    ET.SubElement(root, "folder").text = "JPEGImages"
    ET.SubElement(root, "filename").text = f"{stem}.jpg"
    size = ET.SubElement(root, "size")
    for k, v in (("width", w), ("height", h), ("depth", 3)):
        ET.SubElement(size, k).text = str(v)
    for b in boxes:
        obj = ET.SubElement(root, "object")
        ET.SubElement(obj, "name").text = official[b.cls]
        ET.SubElement(obj, "difficult").text = "0"
        bb = ET.SubElement(obj, "bndbox")
        for k, v in (("xmin", math.floor(b.x1)), ("ymin", math.floor(b.y1)), ("xmax", min(w, math.ceil(b.x2))),
                     ("ymax", min(h, math.ceil(b.y2)))):
            ET.SubElement(bb, k).text = str(int(v))
    return ET.tostring(root)


def write_m2cai16(out: Path, name: str, spec: dict, seed: int, width: int, height: int, fps: float) -> None:
    style = _style(spec)
    stems = []
    for v in range(1, int(spec.get("videos") or 10) + 1):
        vid = f"v{v:02d}"
        rng = rng_for(seed, name, vid)
        n = _n_frames(rng, spec)
        frames, _ = _video(rng, spec, style, n, width, height, 1.0, detection_tracks,
                           tool_scale=float(spec.get("tool_scale") or 1.0))
        start = int(rng.integers(1, 40))
        for k, fr in enumerate(frames):
            stem = f"{vid}_{int(fps) * (start + k):06d}"
            stems.append(stem)
            _write(out / "JPEGImages" / f"{stem}.jpg", fr.image)
            (out / "Annotations").mkdir(parents=True, exist_ok=True)
            (out / "Annotations" / f"{stem}.xml").write_bytes(_voc_xml(stem, width, height, fr.boxes))
            if k % 4 == 0:  # the release ships mirrored augmentation copies next to the frames
                _write(out / "JPEGImages" / f"{stem}_flip.jpg", fr.image[:, ::-1])
                flipped = [type(b)(b.cls, width - b.x2, b.y1, width - b.x1, b.y2) for b in fr.boxes]
                (out / "Annotations" / f"{stem}_flip.xml").write_bytes(_voc_xml(f"{stem}_flip", width, height, flipped))
    # the original FRAME-level splits (60/20/20 of shuffled frames: adjacent frames leak across splits)
    rng = rng_for(seed, name, "imagesets")
    order = rng.permutation(len(stems))
    cut1, cut2 = int(0.6 * len(stems)), int(0.8 * len(stems))
    lists = {"train": order[:cut1], "val": order[cut1:cut2], "test": order[cut2:]}
    lists["trainval"] = order[:cut2]
    main = out / "ImageSets" / "Main"
    main.mkdir(parents=True, exist_ok=True)
    for split, idx in lists.items():
        (main / f"{split}.txt").write_text("".join(f"{stems[i]}\n" for i in sorted(idx)))


# --- CholecTrack20 ----------------------------------------------------------------------------

def write_cholectrack20(out: Path, name: str, spec: dict, seed: int, width: int, height: int, fps: float) -> None:
    style = _style(spec)
    for split_dir, videos in CHOLECTRACK20_VIDEOS.items():
        for vid in videos:
            rng = rng_for(seed, name, vid)
            n = _n_frames(rng, spec)
            frames, _ = _video(rng, spec, style, n, width, height, 1.0, detection_tracks,
                               tool_scale=float(spec.get("tool_scale") or 1.0))
            annotations = {}
            for k, fr in enumerate(frames):
                frame = int(fps) * k + 1  # 000001.png, 000026.png, ... (1 fps of the 25 fps video)
                _write(out / split_dir / vid / "Frames" / f"{frame:06d}.png", fr.image)
                annotations[str(frame)] = [{
                    "instrument": TOOL_CLASSES.index(b.cls), "verb": -1, "target": -1, "phase": 0, "triplet": -1,
                    "tool_bbox": [b.x1 / width, b.y1 / height, (b.x2 - b.x1) / width, (b.y2 - b.y1) / height],
                    "operator": int(rng.integers(0, 4)), "iscrowd": 0, "area": float((b.x2 - b.x1) * (b.y2 - b.y1)),
                    "score": 1.0, "intraoperative_track": j + 1, "intracorporeal_track": j + 1,
                    "visibility_track": j + 1, "visibility": 1, "crowded": 0, "visible": 1, "occluded": 0,
                    "bleeding": 0, "smoke": 0, "blurred": 0, "undercoverage": 0, "reflection": 0, "stainedlens": 0,
                } for j, b in enumerate(fr.boxes)]
            doc = {
                "info": {"dataset": "CholecTrack20 (SYNTHETIC stand-in generated by fedmedbench)",
                         "bbox format": "tlwh = [top_left_x, top_left_y, box_width, box_height]"},
                "categories": {"tools": {str(i): c for i, c in enumerate(TOOL_CLASSES)},
                               "operator": {"0": "NULL", "1": "MSLH", "2": "MSRH", "3": "ASRH"}},
                "video": {"seq": vid, "split": SPLIT_WORD[split_dir], "height": height, "width": width,
                          "num_frames": int(fps) * n},
                "annotations": annotations,
            }
            (out / split_dir / vid / f"{vid}.json").write_text(json.dumps(doc))


# --- EndoVis2017 --------------------------------------------------------------------------------

def _ev17_write(vdir: Path, frames: list[Frame], first: int, names: list[str]) -> None:
    for k, fr in enumerate(frames):
        fname = f"frame{first + k:03d}.png"
        _write(vdir / "left_frames" / fname, fr.image)
        for j, label in enumerate(names):
            own = fr.tool_parts[j] if j < len(fr.tool_parts) else np.zeros_like(fr.parts)
            _write(vdir / "ground_truth" / label / fname, (own * 10).astype(np.uint8))
        other = np.zeros_like(fr.parts)  # non-robotic instruments: no part labels (skipped by default)
        _write(vdir / "ground_truth" / "Other_labels" / fname, other)


def write_endovis2017(out: Path, name: str, spec: dict, seed: int, width: int, height: int, fps: float) -> None:
    style = _style(spec)
    n_train, n_test = int(spec.get("videos") or 3), int(spec.get("test_videos") or 0)
    for i in range(1, max(n_train, n_test) + 1):
        vid = f"instrument_dataset_{i}"
        rng = rng_for(seed, name, vid)
        a = _n_frames(rng, spec) if i <= n_train else 0
        b = _n_frames(rng, spec, "test_frames") if i <= n_test else 0
        frames, tracks = _video(rng, spec, style, a + b, width, height, 1.0 / fps, segmentation_tracks)
        names = [f"{side}_{ENDOVIS17_NAMES[t.cls]}_labels" for side, t in zip(("Left", "Right"), tracks, strict=False)]
        if a:
            _ev17_write(out / "train" / vid, frames[:a], 0, names)
        if b:  # test sequences continue the procedure of the same number (frames a.., like frame225..)
            _ev17_write(out / "test" / vid, frames[a:], a, names)


# --- EndoVis2018 --------------------------------------------------------------------------------

def _ev18_labels(fr: Frame) -> np.ndarray:
    rgb = np.zeros(fr.parts.shape + (3,), np.uint8)
    rgb[fr.organ] = ev18.OFFICIAL_COLOURS["kidney-parenchyma"]
    for value, cname in ((1, "instrument-shaft"), (2, "instrument-wrist"), (3, "instrument-clasper")):
        rgb[fr.parts == value] = ev18.OFFICIAL_COLOURS[cname]
    return rgb[..., ::-1]  # written with OpenCV (BGR order)


def write_endovis2018(out: Path, name: str, spec: dict, seed: int, width: int, height: int, fps: float) -> None:
    style = _style(spec)
    labels_json = [{"name": n, "color": list(c), "classid": i} for i, (n, c) in enumerate(ev18.OFFICIAL_COLOURS.items())]
    plan = [("train", i, out / "train" / "miccai_challenge_2018_release_1" / f"seq_{i}")
            for i in range(1, int(spec.get("videos") or 3) + 1)]
    plan += [("test", i, out / "test" / f"seq_{i}") for i in range(1, int(spec.get("test_videos") or 0) + 1)]
    for split, i, sdir in plan:
        rng = rng_for(seed, name, split, i)
        n = _n_frames(rng, spec, "frames" if split == "train" else "test_frames")
        frames, _ = _video(rng, spec, style, n, width, height, 1.0 / fps, segmentation_tracks, organ=True)
        for k, fr in enumerate(frames):
            _write(sdir / "left_frames" / f"frame{k:03d}.png", fr.image)
            _write(sdir / "labels" / f"frame{k:03d}.png", _ev18_labels(fr))
        (sdir / "labels.json").write_text(json.dumps(labels_json))


# --- generic frames + masks (RARP, Hyst-YT, Lob-YT, simulator) ----------------------------------

def write_frames_masks(out: Path, name: str, spec: dict, seed: int, width: int, height: int, fps: float) -> None:
    style = _style(spec)
    label_every = int(spec.get("label_every") or 1)
    counts = {"train": int(spec.get("videos") or 0), "val": int(spec.get("val_videos") or 0),
              "test": int(spec.get("test_videos") or 0)}
    number = 0
    for split, count in counts.items():
        for _ in range(count):
            number += 1  # video names are unique across splits (one folder = one procedure)
            vid = f"video_{number:02d}" if not style.flat else f"scene_{number:04d}"
            rng = rng_for(seed, name, split, vid)
            n = _n_frames(rng, spec, "frames" if split == "train" else "test_frames")
            frames, _ = _video(rng, spec, style, n, width, height, 1.0 / fps, segmentation_tracks)
            for k, fr in enumerate(frames):
                _write(out / split / vid / "frames" / f"{k:06d}.png", fr.image)
                if k % label_every == 0:  # binary label sets (GraSP): instrument = 1
                    mask = (fr.parts > 0).astype(fr.parts.dtype) if spec.get("_binary") else fr.parts
                    _write(out / split / vid / "masks" / f"{k:06d}.png", mask)


WRITERS = {
    "m2cai16": write_m2cai16,
    "cholectrack20": write_cholectrack20,
    "endovis2017": write_endovis2017,
    "endovis2018": write_endovis2018,
    "frames_masks": write_frames_masks,
}
OFFICIAL_FPS = {"m2cai16": m2.OFFICIAL_FPS, "cholectrack20": ct20.OFFICIAL_FPS,
                "endovis2017": FRAME_RATES["endovis2017"].fps, "endovis2018": FRAME_RATES["endovis2018"].fps}


def generate(name: str, dataset_cfg: dict, spec: dict, seed: int, width: int, height: int, out: str | Path) -> Path:
    """Write the synthetic stand-in of dataset ``name`` in its layout into ``out`` (atomically)."""
    layout = dataset_cfg["layout"]
    if layout not in WRITERS:
        raise ValueError(f"surgical.synthetic.datasets.{name}: no synthetic writer for layout '{layout}' "
                         f"(available: {sorted(WRITERS)})")
    listed = frame_rate(dataset_cfg.get("release"), name)
    fps = dataset_cfg.get("fps") or OFFICIAL_FPS.get(layout) or (listed.fps if listed else None)
    if not fps:
        raise ValueError(f"surgical.datasets.{name}.fps (or release) must be set to synthesize a '{layout}' dataset")
    width, height = int(spec.get("width") or width), int(spec.get("height") or height)
    with atomic_dir(out) as tmp, _linking(bool(spec.get("distinct_frames"))):
        binary = layout == "frames_masks" and dataset_cfg.get("label_set") == "binary"
        WRITERS[layout](tmp, name, {**spec, "_binary": binary}, seed, width, height, float(fps))
        (tmp / "SYNTHETIC.txt").write_text(
            f"SYNTHETIC stand-in for '{name}' in the {layout} layout, generated by fedmedbench "
            f"(seed {seed}, style {spec.get('style')}). Not real data; never a paper reproduction.\n")
    return Path(out)
