"""A user's own dataset in the MedMNIST npz layout, registered by name under ``datasets:``.

Official flags take their classes, channels and MD5s from the ``medmnist`` package; a user
dataset brings its own: a class list (its length is the class count every macro metric averages
over), a task, a channel count and the image sizes its files exist in. The file is checked once,
when it enters the workflow: keys, dtypes, shapes, label range and non-empty splits, each error
naming the file and the key. No checksum unless the registry gives one (``md5``).
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import numpy as np

from fedmedbench.data.medmnist import SPLITS, DataError, DatasetInfo, dataset_info, load_npz, md5sum
from fedmedbench.io import atomic_path

#: user dataset names: lower-case letters, digits and '-' (no '_': file names are ``<name>_<size>.npz``)
NAME_PATTERN = r"^[a-z][a-z0-9-]*$"
#: tasks the classification pipeline trains (multi-label is accepted by the registry, not trained yet)
TRAINABLE_TASKS = ("multi-class", "binary")


def user_file(cfg: dict, size: int) -> Path:
    """The user's file for one size: ``path`` may hold ``{size}`` when several sizes exist."""
    return Path(str(cfg["path"]).format(size=size))


def origin_label(cfg: dict, size: int) -> str:
    """How tables and captions name where the data came from."""
    return f"user data: {user_file(cfg, size)}"


def info(name: str, cfg: dict | None = None) -> DatasetInfo:
    """Classes, channels and task of an official flag (``cfg`` None) or of a registered user dataset."""
    if cfg is None:
        return dataset_info(name)
    labels = tuple(str(x) for x in cfg["labels"])
    return DatasetInfo(flag=name, n_channels=int(cfg["channels"]), n_classes=len(labels), task=cfg["task"],
                       n_samples={}, class_names=labels)


def check_registry_entry(name: str, cfg: dict) -> None:
    """What the schema cannot say: a usable name, a class list that fits the task."""
    key = f"datasets.{name}"
    if not re.match(NAME_PATTERN, name):
        raise ValueError(f"config error at '{key}': name must match {NAME_PATTERN} (lower-case letters, digits, '-')")
    if len(set(cfg["labels"])) != len(cfg["labels"]):
        raise ValueError(f"config error at '{key}.labels': class names must be distinct, got {cfg['labels']}")
    if cfg["task"] == "binary" and len(cfg["labels"]) != 2:
        raise ValueError(f"config error at '{key}.labels': a binary task has exactly 2 classes, got {len(cfg['labels'])}")
    if cfg["task"] not in TRAINABLE_TASKS:
        raise ValueError(f"config error at '{key}.task': '{cfg['task']}' datasets can be registered but not trained yet "
                         f"(trainable: {', '.join(TRAINABLE_TASKS)})")
    if len(cfg["sizes"]) > 1 and "{size}" not in str(cfg["path"]):
        raise ValueError(f"config error at '{key}.path': several sizes {cfg['sizes']} need '{{size}}' in the path")


def validate(path: str | Path, cfg: dict, size: int) -> dict[str, np.ndarray]:
    """Load a user file and check it against its registry entry; errors name the file and key."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            label_dtypes = {f"{s}_labels": npz[f"{s}_labels"].dtype for s in SPLITS if f"{s}_labels" in npz.files}
    except FileNotFoundError as exc:
        raise DataError(f"{path}: file not found (datasets: entry's path)") from exc
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise DataError(f"{path}: corrupt or truncated npz ({type(exc).__name__}: {exc})") from exc
    for key, dtype in label_dtypes.items():
        if not np.issubdtype(dtype, np.integer):
            raise DataError(f"{path}: {key} has dtype {dtype}, expected integer class indices")
    arrays = load_npz(path, expect_size=size, expect_channels=int(cfg["channels"]))
    n_classes = len(cfg["labels"])
    for split in SPLITS:
        labels = arrays[f"{split}_labels"]
        if labels.size == 0:
            raise DataError(f"{path}: {split}_images/{split}_labels are empty; every split needs samples")
        if labels.max() >= n_classes:
            raise DataError(f"{path}: {split}_labels go up to {int(labels.max())} but the dataset has "
                            f"{n_classes} classes {list(cfg['labels'])} (labels are 0..{n_classes - 1})")
    return arrays


def import_file(cfg: dict, size: int, target: str | Path) -> dict[str, int]:
    """Check the user's file (MD5 first when given) and copy it, unchanged, into the workflow."""
    source = user_file(cfg, size)
    if not source.is_file():
        raise DataError(f"{source}: file not found (datasets: entry's path)")
    if cfg.get("md5"):
        actual = md5sum(source)
        if actual != cfg["md5"]:
            raise DataError(f"{source}: MD5 mismatch (expected {cfg['md5']}, got {actual}); the file is corrupt or changed")
    arrays = validate(source, cfg, size)
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    return {s: int(arrays[f"{s}_labels"].size) for s in SPLITS}
