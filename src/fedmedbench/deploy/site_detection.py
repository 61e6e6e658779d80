"""Detection site folders: the client's own YOLO export, copied file for file.

``site-XX/{train,val,test}/{images,labels}/`` (the client's splits of the export, names
unchanged, so Ultralytics orders and samples them as in the simulation) and ``data.yaml``
(paths relative to the folder, for a person looking at it). The other clients' test frames
(the export's ``test_cd``, the CD columns of the ID/CD matrix) are another site's data and are
not in the folder: a site scores its own model on its own test split (``test<pid>_*`` =
``local_*``); ``test<j>_*`` of other sites and ``cd_*`` are NaN in a deployment.

At the site the folder is staged as the simulation stages the export (a view of links under
the site's state folder, where Ultralytics writes its label caches): the data folder itself
is never written to.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

from fedmedbench.deploy.site_data import MANIFEST, Site, list_files
from fedmedbench.fl.state.scratch import scratch_dir
from fedmedbench.fl.tasks.detection.staging import read_manifest
from fedmedbench.fl.tasks.detection.task import EVAL_DEFAULTS, DetectionClient, cd_from_pairs

SPLITS = ("train", "val", "test")
METRICS = ("map50", "map50_95")


def num_clients(spec) -> int:
    return len(read_manifest(spec.partition_path)["clients"])


def export(spec, pid: int, folder: Path) -> dict[str, Any]:
    manifest = read_manifest(spec.partition_path)
    client = manifest["clients"][pid]
    src = Path(client["data_yaml"]).parent
    names = []
    for split in SPLITS:
        for kind in ("images", "labels"):
            d = src / split / kind
            if not d.is_dir():
                raise FileNotFoundError(f"{d}: expected the {kind}/ folder of the YOLO export's {split} split")
            for f in sorted(d.iterdir()):
                name = f"{split}/{kind}/{f.name}"
                (folder / split / kind).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, folder / name)
                names.append(name)
    classes = list(manifest["classes"])
    doc = {"path": ".", "train": "train/images", "val": "val/images", "test": "test/images",
           "nc": len(classes), "names": dict(enumerate(classes))}
    (folder / "data.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return {"classes": classes, "num_classes": len(classes), "in_channels": 3, "counts": {s: client["counts"][s] for s in SPLITS},
            "files": list_files(folder, [*names, "data.yaml"])}


def _stage(folder: Path, stage: Path, classes: list[str]) -> Path:
    """A view of the site folder under ``stage`` (links; Ultralytics' caches land there), built once."""
    digest = hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()[:16]
    marker = stage / "STAGED.json"
    if marker.is_file() and json.loads(marker.read_text()).get("manifest_sha") == digest:
        return stage
    stage.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stage.name}.", dir=stage.parent))
    try:
        for split in SPLITS:
            (tmp / split / "images").mkdir(parents=True)
            for img in sorted((folder / split / "images").iterdir()):
                os.symlink(img.resolve(), tmp / split / "images" / img.name)
            os.symlink((folder / split / "labels").resolve(), tmp / split / "labels", target_is_directory=True)
        doc = {"path": str(stage), **{s: str(stage / s / "images") for s in SPLITS},
               "nc": len(classes), "names": dict(enumerate(classes))}
        (tmp / "data.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        (tmp / "STAGED.json").write_text(json.dumps({"site": str(folder), "manifest_sha": digest}))
        if stage.exists():
            shutil.rmtree(stage)
        os.rename(tmp, stage)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return stage


def load(folder: Path, manifest: dict[str, Any], spec) -> Site:
    pid, n = int(manifest["partition_id"]), int(manifest["num_clients"])
    work = scratch_dir(spec.run_dir)
    stage = _stage(folder, work / "stage" / f"client_{pid}", list(manifest["classes"]))
    data = DetectionClient(pid=pid, data_yaml=str(stage / "data.yaml"), data_cd_yaml=str(stage / "data.yaml"),
                           num_train=int(manifest["counts"]["train"]["frames"]), imgsz=spec.image_size,
                           seed=spec.seed * n + pid, workdir=str(work / f"client_{pid}"),
                           read_ahead=spec.loader_workers >= 1)
    params = {**EVAL_DEFAULTS, **spec.task_params}

    def evaluate(model: torch.nn.Module, data: DetectionClient, device: torch.device) -> dict[str, float]:
        from fedmedbench.fl.tasks.detection.yolo import validate_yolo

        own = validate_yolo(model, data.data_yaml, "test", imgsz=spec.image_size, batch=params["eval_batch"],
                            device=device, workdir=data.workdir, conf=params["conf"], iou=params["iou"],
                            rect=params["rect"])
        row = {f"test{j}_{k}": (own[k] if j == pid else math.nan) for j in range(n) for k in METRICS}
        return {**row, **cd_from_pairs(row, pid, n, METRICS)}

    return Site(data, evaluate)
