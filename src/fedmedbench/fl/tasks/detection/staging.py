"""Per-run views of the YOLO export that Ultralytics may write next to.

Ultralytics resolves dataset paths and writes ``labels.cache`` beside each split's
``labels`` folder. Pointed at ``resources/surgical/.../yolo`` directly, every training
job would write into another rule's output. Each run therefore gets its own staged
copy made of links: ``<stage>/client_<k>/<split>/images/`` is a real folder of
symlinks to the exported images (so path resolution stays in the stage), ``labels``
is a symlink to the exported labels folder (Ultralytics finds a label by replacing
``/images/`` with ``/labels/`` in the unresolved image path), and the caches land in
the stage. Built once per run under a temporary name and renamed into place, so
concurrent client processes see either nothing or a complete stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import yaml

SPLITS = ("train", "val", "test", "test_cd")
POOLED_SPLITS = ("train", "val", "test")


def read_manifest(path: str | Path) -> dict:
    """The export's manifest.json, checked for what the study needs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: YOLO export manifest not found (run export_yolo first)")
    manifest = json.loads(path.read_text())
    for key in ("classes", "clients", "pooled"):
        if key not in manifest:
            raise ValueError(f"{path}: manifest has no '{key}' entry")
    for c in manifest["clients"]:
        if int(c["counts"]["train"]["frames"]) < 1:
            raise ValueError(f"{path}: client {c['client']} has no training images")
    return manifest


def _stage_split(src: Path, dst: Path) -> None:
    images, labels = src / "images", src / "labels"
    if not images.is_dir() or not labels.is_dir():
        raise FileNotFoundError(f"{src}: expected images/ and labels/ folders of the YOLO export")
    (dst / "images").mkdir(parents=True)
    for img in sorted(images.iterdir()):
        os.symlink(img.resolve(), dst / "images" / img.name)
    os.symlink(labels.resolve(), dst / "labels", target_is_directory=True)


def _write_yaml(path: Path, root: Path, classes: list[str], test: str) -> None:
    doc = {"path": str(root), "train": str(root / "train" / "images"), "val": str(root / "val" / "images"),
           "test": str(root / test / "images"), "nc": len(classes), "names": dict(enumerate(classes))}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def stage_export(manifest_path: str | Path, stage: str | Path) -> Path:
    """Stage every client (and the pooled set) of one exported setting under ``stage``; idempotent."""
    manifest_path, stage = Path(manifest_path), Path(stage).resolve()
    digest = hashlib.sha256(manifest_path.read_bytes()).hexdigest()[:16]
    marker = stage / "STAGED.json"
    if marker.is_file() and json.loads(marker.read_text()).get("manifest_sha") == digest:
        return stage
    manifest = read_manifest(manifest_path)
    classes = list(manifest["classes"])
    stage.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stage.name}.", dir=stage.parent))
    try:
        for c in manifest["clients"]:
            src, dst = Path(c["data_yaml"]).parent, tmp / f"client_{int(c['client'])}"
            for split in SPLITS:
                _stage_split(src / split, dst / split)
            final = stage / dst.name
            _write_yaml(dst / "data.yaml", final, classes, "test")
            _write_yaml(dst / "data_cd.yaml", final, classes, "test_cd")
        src = Path(manifest["pooled"]["data_yaml"]).parent
        for split in POOLED_SPLITS:
            _stage_split(src / split, tmp / "pooled" / split)
        _write_yaml(tmp / "pooled" / "data.yaml", stage / "pooled", classes, "test")
        (tmp / "STAGED.json").write_text(json.dumps({"manifest": str(manifest_path), "manifest_sha": digest}))
        if stage.exists():
            if marker.is_file() and json.loads(marker.read_text()).get("manifest_sha") == digest:
                return stage  # another process finished first
            shutil.rmtree(stage)
        try:
            os.rename(tmp, stage)
        except OSError:
            if not (marker.is_file() and json.loads(marker.read_text()).get("manifest_sha") == digest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return stage
