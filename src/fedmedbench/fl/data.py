"""Client and server views of a partitioned dataset (loaded once per process).

A run has data *sources* (name -> MedMNIST-format npz: ``base`` or one per imaging
domain) and a partition JSON whose indices are pool indices into each source (see
``fedmedbench.partition.schemes``). Arrays are kept as uint8 tensors and converted to
float per batch, so 100 clients cost the dataset once, not 100 times.

With ``client_augmentation: reference`` (``RunSpec.client_augmentation``: the mode, the config's
``domains`` and ``domain_seed``) a client also gets its training images from the clean ``base``
source (the domain files keep the base file's pool order) and its domain's acquisition device, so
its training loop redraws the domain noise at every read (fl/augment.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fedmedbench.data.domains import device_of
from fedmedbench.data.medmnist import SPLITS, load_npz
from fedmedbench.fl.api.method import ClientData
from fedmedbench.fl.augment import CLIENT_AUGMENTATIONS, VALIDATION_AUGMENTATIONS
from fedmedbench.partition.schemes import check_labels, check_partition, check_partition_keys, check_sealed
from fedmedbench.workflow.io import read_json


@lru_cache(maxsize=16)
def load_pool(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N,C,H,W uint8) and labels (int64) of train+val+test, in pool order."""
    arrays = load_npz(path)
    images = np.concatenate([arrays[f"{s}_images"] for s in SPLITS])
    labels = np.concatenate([arrays[f"{s}_labels"] for s in SPLITS])
    if images.ndim == 3:
        images = images[:, None]
    else:
        images = images.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels)


@lru_cache(maxsize=8)
def load_partition(path: str) -> dict:
    return read_json(path)


#: the source that holds the images before any domain shift
CLEAN_SOURCE = "base"


class FederatedData:
    def __init__(self, partition_path: str | Path, sources: dict[str, str], augmentation: dict | None = None) -> None:
        mode = augmentation.get("mode", "none") if augmentation else "none"
        if mode not in CLIENT_AUGMENTATIONS:  # a run spec written by hand: the schema checks the config's
            raise ValueError(f"run spec client_augmentation.mode = {mode!r}: choose one of {list(CLIENT_AUGMENTATIONS)}")
        self.augmentation = augmentation if mode != "none" else None
        if self.augmentation and not isinstance(self.augmentation.get("domains"), dict):
            raise ValueError(f"run spec client_augmentation.domains = {self.augmentation.get('domains')!r}: give a "
                             "mapping of each domain source's name to its steps (the config's domains; {} for none)")
        if self.augmentation and CLEAN_SOURCE not in sources:
            raise ValueError(f"{partition_path}: client_augmentation: {self.augmentation['mode']} reads the clean "
                             f"training images from the '{CLEAN_SOURCE}' source, which the run does not provide")
        self.partition = load_partition(str(partition_path))
        self.partition_path = str(partition_path)
        check_partition_keys(self.partition, self.partition_path)
        check_sealed(self.partition, self.partition_path)  # an edited partition is never trained on
        self._checked: set[str] = set()  # sources whose indices were checked (partition.check_partition)
        self.sources = dict(sources)
        needed = {c["source"] for c in self.partition["clients"]} | {g["source"] for g in self.partition["global_test"]}
        missing = needed - set(self.sources)
        if missing:
            raise KeyError(f"{partition_path}: partition uses data source(s) {sorted(missing)} that the run does not provide")

    @property
    def num_clients(self) -> int:
        return len(self.partition["clients"])

    @property
    def num_classes(self) -> int:
        return int(self.partition["num_classes"])

    def _take(self, source: str, idx) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = load_pool(self.sources[source])
        if source not in self._checked:  # once per source, when its pool is first loaded
            check_labels(self.partition, source, y.numpy(), self.sources[source], self.partition_path)
            check_partition(self.partition, {source: len(y)}, self.partition_path)
            self._checked.add(source)
        idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return x[idx], y[idx]

    def client(self, pid: int) -> ClientData:
        c = self.partition["clients"][pid]
        parts = [self._take(c["source"], c[p]) for p in ("train", "val", "test")]
        data = ClientData(*parts[0], *parts[1], *parts[2])
        return data if self.augmentation is None else self._with_clean_reads(c, data)

    def _clean_reads(self, client: dict, part: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's images of ``part`` before its domain shift, and its device (c, b, sigma) per image."""
        source, aug = client["source"], self.augmentation
        steps = aug["domains"].get(source, []) if source != CLEAN_SOURCE else []
        if steps:
            self._check_same_pool(source)
        device = device_of(steps, source, int(aug.get("domain_seed", 0)))
        clean_x = self._take(CLEAN_SOURCE if steps else source, client[part])[0]
        return clean_x, torch.tensor(device, dtype=torch.float32).repeat(clean_x.shape[0], 1)

    def _check_same_pool(self, source: str) -> None:
        """A domain file holds the clean file's images in the same order (its labels, pool for pool, are the
        clean file's): the clean reads take the domain's indices into the clean file."""
        clean, shifted = self.sources[CLEAN_SOURCE], self.sources[source]
        if not torch.equal(load_pool(clean)[1], load_pool(shifted)[1]):
            raise ValueError(f"{shifted}: its labels are not those of the clean '{CLEAN_SOURCE}' file {clean}, pool for "
                             f"pool; client_augmentation reads the domain '{source}' images from that file by the same "
                             "indices, so both must hold the same images in the same order (build the domain file again)")

    def _with_clean_reads(self, client: dict, data: ClientData) -> ClientData:
        """``data`` plus its clean training (and, under ``reference``, validation) images and their device,
        one row per image."""
        clean_x, rows = self._clean_reads(client, "train")
        data = replace(data, aug_x=clean_x, aug_device=rows)
        if self.augmentation["mode"] in VALIDATION_AUGMENTATIONS:
            val_x, val_rows = self._clean_reads(client, "val")
            data = replace(data, val_aug_x=val_x, val_aug_device=val_rows)
        return data

    def global_val_reads(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows of :meth:`global_val` before their domain shift, with their devices, when the validation
        shares are read as the authors' loader (``client_augmentation: reference``); else None."""
        if self.augmentation is None or self.augmentation["mode"] not in VALIDATION_AUGMENTATIONS:
            return None
        parts = [self._clean_reads(c, "val") for c in self.partition["clients"]]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def pooled(self) -> ClientData:
        """All clients' data concatenated (the centralized baseline's one client)."""
        clients = [self.client(i) for i in range(self.num_clients)]
        cat = lambda attr: torch.cat([getattr(c, attr) for c in clients])  # noqa: E731
        names = ["train_x", "train_y", "val_x", "val_y", "test_x", "test_y"]
        extra = {a: cat(a) for a in ("aug_x", "aug_device", "val_aug_x", "val_aug_device") if getattr(clients[0], a) is not None}
        return ClientData(*(cat(a) for a in names), **extra)

    def global_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self._take(g["source"], g["idx"]) for g in self.partition["global_test"]]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def global_val(self) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self._take(c["source"], c["val"]) for c in self.partition["clients"]]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
