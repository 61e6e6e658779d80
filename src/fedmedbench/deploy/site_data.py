"""One self-contained data folder per site, and the verified reader a site's ClientApp uses.

A site is given only its own folder ``site-XX/``: its data in the form its task reads it
(one module per task: :mod:`~fedmedbench.deploy.site_classification`,
:mod:`~fedmedbench.deploy.site_detection`, :mod:`~fedmedbench.deploy.site_segmentation`),
copies of the files the model is built from (``model/``: pre-trained weights) and
``manifest.json`` (task, partition id, counts, and the SHA-256 and size of every file).
The reader checks the task, the partition id and every hash before anything is trained,
and refuses a file the manifest does not list; the error names the file.
"""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedmedbench.workflow import io

MANIFEST = "manifest.json"
MODEL_DIR = "model"
#: task -> the module that writes and reads its site folders (``export(spec, pid, folder)``, ``load(folder, manifest, spec)``)
FORMATS = {
    "classification": "fedmedbench.deploy.site_classification",
    "detection": "fedmedbench.deploy.site_detection",
    "segmentation": "fedmedbench.deploy.site_segmentation",
}
#: spec fields (dotted paths) that name files: the server's copy keeps them, what a site receives has them blank
PATH_FIELDS = ("run_dir", "partition_path", "sources", "pretrained_path", "task_params.clips_root",
               "task_params.model.encoder_weights", "task_params.indicator.clip_weights", "method_params.serq.clips_root")
#: of those, the files a model is built from: copied into every site folder (``model/``), read there by the site
MODEL_FILES = ("pretrained_path", "task_params.model.encoder_weights")


class SiteDataError(RuntimeError):
    """A site folder is missing, corrupt or belongs to another site (the message names the file)."""


@dataclass
class Site:
    """A site's own data as its task's client code reads it (``ctx.data``), and how the site scores
    its own model (personalized methods): on its own test split only; scores that need another
    site's data are NaN."""

    data: Any
    evaluate: Callable[[torch.nn.Module, Any, torch.device], dict[str, float]]


def site_folder(root: str | Path, pid: int) -> Path:
    return Path(root) / f"site-{pid:02d}"


def get_field(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def set_field(d: dict[str, Any], dotted: str, value: Any) -> bool:
    """Set an existing nested field; False (and nothing set) where a parent is absent."""
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(d.get(part), dict):
            return False
        d = d[part]
    if last not in d and parents:
        return False
    d[last] = value
    return True


def _format(task: str):
    if task not in FORMATS:
        raise ValueError(f"task '{task}' has no site-folder format; deployable: {sorted(FORMATS)}")
    return importlib.import_module(FORMATS[task])


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": io.file_digest(path, "sha256"), "bytes": path.stat().st_size}


def list_files(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Manifest entries of files under ``folder`` (relative POSIX names)."""
    return {name: file_entry(folder / name) for name in sorted(names)}


def export_sites(spec, out_root: str | Path, describe: dict[str, Any]) -> list[Path]:
    """Write one folder per client of ``spec``'s partition; returns the folders in partition order."""
    fmt = _format(spec.task)
    folders = []
    num_clients = fmt.num_clients(spec)
    for pid in range(num_clients):
        folder = site_folder(out_root, pid)
        with io.naming_full_disk(folder, "site folder"):
            folder.mkdir(parents=True, exist_ok=True)
            extra = fmt.export(spec, pid, folder)
            files = dict(extra.pop("files"))
            model_files = {}
            for field in MODEL_FILES:
                src = get_field(spec.to_dict(), field)
                if src:
                    if not Path(src).is_file():
                        raise FileNotFoundError(f"{src}: model file named by the spec's '{field}' not found")
                    name = f"{MODEL_DIR}/{Path(src).name}"
                    (folder / MODEL_DIR).mkdir(exist_ok=True)
                    shutil.copyfile(src, folder / name)
                    files[name] = file_entry(folder / name)
                    model_files[field] = name
        manifest = {**describe, "task": spec.task, "partition_id": pid, "num_clients": num_clients, **extra,
                    "model_files": model_files, "files": files}
        io.write_json(folder / MANIFEST, manifest)
        folders.append(folder)
    return folders


def read_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise SiteDataError(f"{path}: no site manifest (export the site's folder with the export_site_data rule)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SiteDataError(f"{path}: not valid JSON ({exc})") from exc


def verify_files(folder: Path, manifest: dict[str, Any]) -> None:
    """Every listed file is there with its recorded SHA-256; no file the manifest does not list."""
    listed = manifest.get("files") or {}
    for name, entry in listed.items():
        path = folder / name
        if not path.is_file():
            raise SiteDataError(f"{path}: site data file missing (listed in {folder / MANIFEST})")
        actual = io.file_digest(path, "sha256")
        if actual != entry["sha256"]:
            raise SiteDataError(f"{path}: SHA-256 {actual} does not match the manifest's {entry['sha256']} "
                                "(corrupt or replaced)")
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != MANIFEST and name not in listed:
            raise SiteDataError(f"{path}: file not listed in {folder / MANIFEST} (added or renamed after export)")


def check_partition(folder: Path, manifest: dict[str, Any], pid: int, task: str) -> None:
    if int(manifest.get("partition_id", -1)) != int(pid):
        raise SiteDataError(f"{folder / MANIFEST}: folder of partition {manifest.get('partition_id')}, "
                            f"but this SuperNode is partition-id={pid}")
    held = manifest.get("task", "classification")
    if held != task:
        raise SiteDataError(f"{folder / MANIFEST}: this site's folder holds {held} data, the server's run is a {task} run")


def load_site(folder: str | Path, pid: int, spec) -> Site:
    """The site's data for ``spec``'s task, after checking that the folder is this site's and intact."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    check_partition(folder, manifest, pid, spec.task)
    verify_files(folder, manifest)
    return _format(spec.task).load(folder, manifest, spec)
