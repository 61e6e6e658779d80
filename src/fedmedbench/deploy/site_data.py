"""One self-contained data folder per site, and the reader a site's ClientApp uses.

A site is given only its own folder: ``data.npz`` (its train/val/test images and labels in
the MedMNIST npz layout, in the order the partition lists them, so training is bit-identical
to the simulation) and ``manifest.json`` (partition id, shapes, class count, SHA-256 of the
data file). The reader verifies the hash and the partition id before anything is trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench import io
from fedmedbench.data.medmnist import load_npz
from fedmedbench.fl.data import FederatedData
from fedmedbench.fl.registry import ClientData

DATA_FILE = "data.npz"
MANIFEST = "manifest.json"
PARTS = ("train", "val", "test")


class SiteDataError(RuntimeError):
    """A site folder is missing, corrupt or belongs to another site (the message names the file)."""


def site_folder(root: str | Path, pid: int) -> Path:
    return Path(root) / f"site-{pid:02d}"


def _sha256(path: Path) -> str:
    return io.file_digest(path, "sha256")


def _to_npz_images(x: torch.Tensor) -> np.ndarray:
    """(N,C,H,W) uint8 -> MedMNIST layout: (N,H,W) for one channel, (N,H,W,C) otherwise."""
    arr = x.numpy()
    return arr[:, 0] if arr.shape[1] == 1 else arr.transpose(0, 2, 3, 1)


def export_sites(partition_path: str | Path, sources: dict[str, str], out_root: str | Path,
                 describe: dict[str, Any]) -> list[Path]:
    """Write one folder per client of the partition; returns the folders in partition order."""
    data = FederatedData(partition_path, sources)
    folders = []
    for pid in range(data.num_clients):
        client = data.client(pid)
        folder = site_folder(out_root, pid)
        arrays = {}
        for part in PARTS:
            arrays[f"{part}_images"] = _to_npz_images(getattr(client, f"{part}_x"))
            arrays[f"{part}_labels"] = getattr(client, f"{part}_y").numpy().reshape(-1, 1)
        io.write_npz(folder / DATA_FILE, arrays)
        manifest = {
            **describe,
            "partition_id": pid,
            "num_clients": data.num_clients,
            "num_classes": data.num_classes,
            "in_channels": int(client.train_x.shape[1]),
            "counts": {part: int(getattr(client, f"{part}_y").shape[0]) for part in PARTS},
            "files": {DATA_FILE: {"sha256": _sha256(folder / DATA_FILE), "bytes": (folder / DATA_FILE).stat().st_size}},
        }
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


def load_site(folder: str | Path, pid: int) -> ClientData:
    """The site's tensors, after checking that the folder is this site's and intact."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if int(manifest.get("partition_id", -1)) != int(pid):
        raise SiteDataError(f"{folder / MANIFEST}: folder of partition {manifest.get('partition_id')}, "
                            f"but this SuperNode is partition-id={pid}")
    path = folder / DATA_FILE
    if not path.is_file():
        raise SiteDataError(f"{path}: site data file missing")
    expected = manifest["files"][DATA_FILE]["sha256"]
    actual = _sha256(path)
    if actual != expected:
        raise SiteDataError(f"{path}: SHA-256 {actual} does not match the manifest's {expected} (corrupt or replaced)")
    arrays = load_npz(path)  # validates keys, dtypes and shapes, naming the file
    parts = []
    for part in PARTS:
        images = arrays[f"{part}_images"]
        images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
        parts += [torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(arrays[f"{part}_labels"])]
    return ClientData(*parts)
