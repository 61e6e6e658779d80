"""Classification site folders: ``data.npz`` with the site's train/val/test images and labels in
the MedMNIST npz layout, in the order the partition lists them (so training is bit-identical
to the simulation). A site scores its own model on its own test split (``local_*``); the
global test set stays with the server (``global_*`` NaN at a site)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench.data.medmnist import load_npz
from fedmedbench.deploy.site_data import Site, list_files
from fedmedbench.fl.api.method import ClientData, TrainConfig
from fedmedbench.fl.data import FederatedData
from fedmedbench.workflow import io

DATA_FILE = "data.npz"
PARTS = ("train", "val", "test")


def _to_npz_images(x: torch.Tensor) -> np.ndarray:
    """(N,C,H,W) uint8 -> MedMNIST layout: (N,H,W) for one channel, (N,H,W,C) otherwise."""
    arr = x.numpy()
    return arr[:, 0] if arr.shape[1] == 1 else arr.transpose(0, 2, 3, 1)


def num_clients(spec) -> int:
    return FederatedData(spec.partition_path, spec.sources).num_clients


def export(spec, pid: int, folder: Path) -> dict[str, Any]:
    data = FederatedData(spec.partition_path, spec.sources)
    client = data.client(pid)
    arrays = {}
    for part in PARTS:
        arrays[f"{part}_images"] = _to_npz_images(getattr(client, f"{part}_x"))
        arrays[f"{part}_labels"] = getattr(client, f"{part}_y").numpy().reshape(-1, 1)
    io.write_npz(folder / DATA_FILE, arrays)
    return {"num_classes": data.num_classes, "in_channels": int(client.train_x.shape[1]),
            "counts": {part: int(getattr(client, f"{part}_y").shape[0]) for part in PARTS},
            "files": list_files(folder, [DATA_FILE])}


def load(folder: Path, manifest: dict[str, Any], spec) -> Site:
    arrays = load_npz(folder / DATA_FILE)  # validates keys, dtypes and shapes, naming the file
    parts = []
    for part in PARTS:
        images = arrays[f"{part}_images"]
        images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
        parts += [torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(arrays[f"{part}_labels"])]
    bs = TrainConfig.from_spec(spec).eval_batch_size

    def evaluate(model: torch.nn.Module, data: ClientData, device: torch.device) -> dict[str, float]:
        from fedmedbench.fl.training import evaluate as score

        out = {f"local_{k}": v for k, v in score(model, data.test_x, data.test_y, bs, device).items()}
        out.update({"global_" + k.removeprefix("local_"): math.nan for k in list(out)})
        return out

    return Site(ClientData(*parts), evaluate)
