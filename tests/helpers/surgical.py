"""Small surgical datasets in their real release layouts, for adapter, re-curation and export tests."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import yaml

from fedmedbench.data.surgical import synthetic_layouts as SL

W, H = 64, 48
SPECS = {
    "m2cai16": ({"layout": "m2cai16", "folder": "m2cai16-tool-locations"},
                {"style": "cholecystectomy_a", "videos": 10, "frames": [3, 5]}),
    "cholectrack20": ({"layout": "cholectrack20", "folder": "CholecTrack20"},
                      {"style": "cholecystectomy_b", "frames": [3, 7]}),
    "endovis2017": ({"layout": "endovis2017", "folder": "EndoVis2017", "fps": 5},
                    {"style": "nephrectomy_a", "videos": 2, "test_videos": 3, "frames": [5, 5], "test_frames": [3, 3]}),
    "endovis2018": ({"layout": "endovis2018", "folder": "EndoVis2018", "fps": 5},
                    {"style": "nephrectomy_b", "videos": 2, "test_videos": 1, "frames": [4, 4]}),
    "rarp": ({"layout": "frames_masks", "folder": "RARP", "fps": 5},
             {"style": "prostatectomy", "videos": 2, "test_videos": 1, "frames": [6, 6], "label_every": 2}),
}
CT20_SPLITS = {"mode": "lists", "train": ["VID02", "VID04", "VID11", "VID13", "VID17", "VID23", "VID96"],
               "val": ["VID110", "VID37", "VID103"],
               "test": ["VID01", "VID06", "VID07", "VID12", "VID25", "VID39", "VID92", "VID111"]}
M2_SPLITS = {"mode": "lists", "train": ["v01", "v02", "v03", "v04", "v05", "v06"], "val": ["v07", "v08"],
             "test": ["v09", "v10"]}
TOOL_GROUPS = {"energy": ["bipolar", "hook"], "cold": ["grasper", "scissors"]}


def make(root: Path, name: str, seed: int = 0) -> tuple[dict, Path]:
    """Write dataset ``name`` (synthetic, real layout) under ``root``; returns (config, folder)."""
    cfg, spec = SPECS[name]
    out = root / cfg["folder"]
    SL.generate(name, cfg, spec, seed, W, H, out)
    return dict(cfg), out


def garbage(path: Path) -> None:
    """Replace a file by bytes no image decoder accepts."""
    path.write_bytes(b"this is not an image")


def write_yolo_folder(root: Path) -> Path:
    """A YOLO export: two videos, train/val, one label file per image."""
    folder = root / "yolo_ds"
    (folder / "data.yaml").parent.mkdir(parents=True, exist_ok=True)
    (folder / "data.yaml").write_text(yaml.safe_dump({"names": ["Grasper", "Hook", "gauze"]}))
    rng = np.random.default_rng(0)
    for split, vids in (("train", ["caseA", "caseB"]), ("val", ["caseC"])):
        for vid in vids:
            for frame in (10, 20, 30):
                img = rng.integers(0, 255, (H, W, 3), dtype=np.uint8)
                p = folder / "images" / split / f"{vid}_{frame:05d}.jpg"
                p.parent.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(p), img)
                lab = folder / "labels" / split / f"{vid}_{frame:05d}.txt"
                lab.parent.mkdir(parents=True, exist_ok=True)
                lab.write_text("0 0.5 0.5 0.25 0.5\n2 0.2 0.3 0.1 0.1\n")
    return folder


def write_coco_folder(root: Path) -> Path:
    folder = root / "coco_ds"
    rng = np.random.default_rng(1)
    for split, vids in (("train", ["p1", "p2"]), ("test", ["p3"])):
        images, anns = [], []
        for vid in vids:
            for frame in (1, 2):
                name = f"{vid}_{frame:04d}.png"
                p = folder / "images" / split / name
                p.parent.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(p), rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
                iid = len(images) + 1
                images.append({"id": iid, "file_name": name, "width": W, "height": H})
                anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": 3, "bbox": [4, 6, 20, 10]})
        doc = {"images": images, "annotations": anns, "categories": [{"id": 3, "name": "scissors"}]}
        (folder / "annotations").mkdir(parents=True, exist_ok=True)
        (folder / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    return folder


def yolo_setting(root: Path, num_clients: int) -> Path:
    """A YOLO export of synthetic CholecTrack20 split over ``num_clients`` clients (iid); its manifest.json."""
    from fedmedbench.data.surgical import recurate as R
    from fedmedbench.data.surgical.export_yolo import export_group
    from fedmedbench.data.surgical.group_io import write_group
    from fedmedbench.data.surgical.index import build_index
    from fedmedbench.data.surgical.schema import read_index

    cfg, _ = make(root / "raw", "cholectrack20")
    build_index("cholectrack20", cfg, root / "raw", root / "idx", log=lambda m: None)
    df, meta = read_index(root / "idx")
    group = {"datasets": ["cholectrack20"], "num_clients": num_clients, "seed": 0,
             "exclude_videos": {"cholectrack20": ["VID30", "VID31"]}, "video_splits": {"cholectrack20": CT20_SPLITS},
             "settings": {"a": {"scheme": "iid"}}}
    g = R.build_group("g", {"cholectrack20": df}, {"cholectrack20": meta}, group, TOOL_GROUPS)
    write_group(g, root / "group", "synthetic")
    export_group(root / "group", root / "yolo")
    return root / "yolo" / "a" / "manifest.json"
