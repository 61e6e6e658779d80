"""YOLO (Ultralytics) datasets for every client of every setting of a re-curated group.

Per setting (``<out>/<setting>/``)::

    client_<k>/train|val|test/images/<dataset>__<video>__<frame>.<ext>   symlink to the original frame
    client_<k>/train|val|test/labels/<same stem>.txt                      class xc yc w h (normalised),
                                                                          empty file = no tool
    client_<k>/test_cd/...        cross-distribution test: the test frames of every OTHER client
    client_<k>/data.yaml          train/val = the client's own; test = its own test (ID evaluation)
    client_<k>/data_cd.yaml       same, test = test_cd (CD evaluation)
    pooled/train|val|test/...     union over clients (centralised baseline; shared val/test)
    pooled/data.yaml
    manifest.json                 classes, per client: yaml paths and frame/box counts

Images are symlinks (no copies of licensed data); Ultralytics finds each label by replacing
the last ``/images/`` of the (unresolved) image path with ``/labels/``. Labels carry the
boxes the client may see (LMO settings: other classes removed).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import yaml

from fedmedbench.data.surgical.fsutil import atomic_dir
from fedmedbench.data.surgical.group_io import read_setting
from fedmedbench.data.surgical.schema import parse_boxes


def _stem(row) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{row.dataset}__{row.video_id}__{int(row.frame):07d}")


def yolo_lines(boxes_json: str, width: int, height: int, class_index: dict[str, int]) -> list[str]:
    """Index boxes (pixels, xyxy) -> YOLO label lines ``class xc yc w h`` normalised to [0, 1]."""
    lines = []
    for b in parse_boxes(boxes_json):
        xc, yc = (b.x1 + b.x2) / 2 / width, (b.y1 + b.y2) / 2 / height
        w, h = (b.x2 - b.x1) / width, (b.y2 - b.y1) / height
        lines.append(f"{class_index[b.cls]} {xc:.6f} {yc:.6f} {w:.6f} {h:.6f}")
    return lines


def write_split(frames: pd.DataFrame, split_dir: Path, class_index: dict[str, int]) -> dict:
    """Symlinks + label files of one split; returns counts."""
    images, labels = split_dir / "images", split_dir / "labels"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    n_boxes = 0
    for row in frames.itertuples(index=False):
        stem = _stem(row)
        src = Path(row.image_path)
        link = images / f"{stem}{src.suffix.lower()}"
        if link.exists() or link.is_symlink():
            raise ValueError(f"{link}: two frames map to the same file name ({row.image_path})")
        os.symlink(src.resolve(), link)
        lines = yolo_lines(row.boxes, int(row.width), int(row.height), class_index)
        n_boxes += len(lines)
        (labels / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))
    return {"frames": int(len(frames)), "boxes": n_boxes}


def _data_yaml(path: Path, root: Path, classes: list[str], test: str) -> None:
    doc = {"path": str(root), "train": "train/images", "val": "val/images", "test": f"{test}/images",
           "nc": len(classes), "names": dict(enumerate(classes))}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def export_setting(frames: pd.DataFrame, info: dict, tmp_dir: Path, final_dir: Path) -> dict:
    classes = list(info["classes"])
    class_index = {c: i for i, c in enumerate(classes)}
    n = len(info["clients"])
    manifest = {"group": info["group"], "setting": info["setting"], "scheme": info["scheme"], "origin": info["origin"],
                "classes": classes, "clients": [], "pooled": {}}
    for k in range(n):
        cdir, cfinal = tmp_dir / f"client_{k}", final_dir / f"client_{k}"
        counts = {}
        for split in ("train", "val", "test"):
            counts[split] = write_split(frames[(frames["client"] == k) & (frames["split"] == split)], cdir / split,
                                        class_index)
        others = frames[(frames["client"] != k) & (frames["split"] == "test")]
        counts["test_cd"] = write_split(others, cdir / "test_cd", class_index)
        _data_yaml(cdir / "data.yaml", cfinal, classes, "test")
        _data_yaml(cdir / "data_cd.yaml", cfinal, classes, "test_cd")
        manifest["clients"].append({"client": k, "data_yaml": str(cfinal / "data.yaml"),
                                    "data_cd_yaml": str(cfinal / "data_cd.yaml"),
                                    "classes": info["clients"][k]["classes"], "counts": counts})
    for split in ("train", "val", "test"):
        manifest["pooled"][split] = write_split(frames[frames["split"] == split], tmp_dir / "pooled" / split, class_index)
    _data_yaml(tmp_dir / "pooled" / "data.yaml", final_dir / "pooled", classes, "test")
    manifest["pooled"]["data_yaml"] = str(final_dir / "pooled" / "data.yaml")
    (tmp_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def export_group(group_dir: str | Path, out_dir: str | Path) -> dict[str, dict]:
    """Export every setting of a re-curated group (``recurate_videos`` output) into ``out_dir`` atomically."""
    group_dir, out_dir = Path(group_dir), Path(out_dir)
    group = json.loads((group_dir / "group.json").read_text())
    manifests = {}
    with atomic_dir(out_dir) as tmp:
        for setting in group["settings"]:
            frames, info = read_setting(group_dir, setting)
            manifests[setting] = export_setting(frames, info, tmp / setting, out_dir.resolve() / setting)
    return manifests
