"""A user's own dataset in the MedMNIST npz layout, registered by name under ``datasets:``.

Official flags take their classes, channels and MD5s from the ``medmnist`` package; a user
dataset brings its own: a class list (its length is the class count every macro metric averages
over), a task, a channel count and the image sizes its files exist in. The file is checked once,
when it enters the workflow: keys, dtypes, shapes, label range and non-empty splits, each error
naming the file and the key. No checksum unless the registry gives one (``md5``).

The imported copy is tied to its source: the import rule carries the source's resolved path and
SHA-256 (:func:`source_fingerprint`) as params, so a moved, replaced or edited source is imported
again, and a missing one stops planning naming it (the copy would otherwise keep training on the
old data while every table names the new path). The import records the copy's SHA-256 beside it
(``<name>_<size>.import.json``), checked wherever the copy is loaded (``medmnist.load_npz``): a copy
replaced afterwards is refused naming the file.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np

from fedmedbench.config.check import ConfigError, config_error
from fedmedbench.data.medmnist import (
    SPLITS,
    DataError,
    DatasetInfo,
    dataset_info,
    load_npz,
    md5sum,
    write_import_record,
)
from fedmedbench.workflow.io import atomic_path, file_digest, write_json

#: user dataset names: lower-case letters, digits and '-' (no '_': file names are ``<name>_<size>.npz``)
NAME_PATTERN = r"^[a-z][a-z0-9-]*$"
#: tasks the classification pipeline trains (multi-label is accepted by the registry, not trained yet)
TRAINABLE_TASKS = ("multi-class", "binary")


#: the one placeholder a dataset path may hold
SIZE_FIELD = "{size}"


def user_file(cfg: dict, size: int) -> Path:
    """The user's file for one size: ``path`` may hold ``{size}`` when several sizes exist (replaced as text:
    no other brace field is expanded, so a path cannot reach attributes the way ``str.format`` would)."""
    return Path(str(cfg["path"]).replace(SIZE_FIELD, str(size)))


class MissingSourceError(ConfigError, DataError):
    """A user dataset's source file is gone: a config error (the workflow names the file that sets the path)."""


def existing_source(name: str, cfg: dict, size: int) -> Path:
    """The source file of a user dataset; a missing one is an error naming it (an imported copy of a file
    that is gone is not trained on as if it were that file)."""
    source = user_file(cfg, size)
    if not source.is_file():
        raise MissingSourceError(f"datasets.{name}.path", f"{source} does not exist (the source of user dataset "
                                 f"'{name}' at {size} px); restore it or point datasets.{name}.path at the file")
    return source


def source_fingerprint(name: str, cfg: dict, size: int, cache_dir: str | Path) -> dict[str, str]:
    """The resolved path and SHA-256 of a user dataset's source file, for the import rule's params.

    The hash is remembered in ``cache_dir`` per (path, inode, size in bytes, modification and change
    times: a write or a replacement changes the change time, which no tool can set back), so planning
    reads a large file once, not at every ``snakemake`` call. A missing source is a clear error.
    """
    source = existing_source(name, cfg, size).resolve()
    stat = source.stat()
    key = {"path": str(source), "inode": stat.st_ino, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
           "ctime_ns": stat.st_ctime_ns}
    memo = Path(cache_dir) / f".{name}_{size}.source.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = None
    if isinstance(known, dict) and {k: known.get(k) for k in key} == key and isinstance(known.get("sha256"), str):
        return {"path": str(source), "sha256": known["sha256"]}
    digest = file_digest(source)
    try:
        write_json(memo, {**key, "sha256": digest})
    except OSError:  # a read-only resources/ folder: the hash is recomputed next time
        pass
    return {"path": str(source), "sha256": digest}


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
        config_error(key, f"name must match {NAME_PATTERN} (lower-case letters, digits, '-')")
    if len(set(cfg["labels"])) != len(cfg["labels"]):
        config_error(f"{key}.labels", f"class names must be distinct, got {cfg['labels']}")
    if cfg["task"] == "binary" and len(cfg["labels"]) != 2:
        config_error(f"{key}.labels", f"a binary task has exactly 2 classes, got {len(cfg['labels'])}")
    if cfg["task"] not in TRAINABLE_TASKS:
        config_error(f"{key}.task", f"'{cfg['task']}' datasets can be registered but not trained yet "
                     f"(trainable: {', '.join(TRAINABLE_TASKS)})")
    if len(cfg["sizes"]) > 1 and SIZE_FIELD not in str(cfg["path"]):
        config_error(f"{key}.path", f"several sizes {cfg['sizes']} need '{{size}}' in the path")
    rest = str(cfg["path"]).replace(SIZE_FIELD, "")
    if "{" in rest or "}" in rest:
        config_error(f"{key}.path", f"{cfg['path']!r} holds braces other than '{{size}}' "
                     "(the only placeholder a dataset path may hold); rename the file or folder")


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


def import_file(cfg: dict, size: int, target: str | Path, expect_sha256: str | None = None) -> dict[str, int]:
    """Check the user's file (MD5 first when given) and copy it, unchanged, into the workflow, its SHA-256
    recorded beside it (``medmnist.import_record_path``: checked wherever the copy is loaded).

    ``expect_sha256`` (the hash the workflow planned with) must be the copy's: a source that changed
    between planning and the import is an error, not a copy of other data under the planned hash.
    """
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
        if expect_sha256 is not None and (copied := file_digest(tmp)) != expect_sha256:
            raise DataError(f"{source}: changed while the workflow ran (planned with SHA-256 {expect_sha256}, "
                            f"found {copied}); rerun snakemake to import it again")
    write_import_record(target, source.resolve())
    return {s: int(arrays[f"{s}_labels"].size) for s in SPLITS}
