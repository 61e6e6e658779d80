"""MedMNIST files: where they come from, how to verify them, how to load them.

The official files are the ``.npz`` archives listed in ``medmnist.INFO`` (URL and MD5
per flag and size). We never trust a file we did not verify: downloads are streamed
to a temp file, MD5-checked and only then renamed into place; a user-provided folder
(``data.medmnist_root``) is verified the same way before use.

A copy that entered the workflow with its SHA-256 recorded beside it (a user dataset's import,
``<name>_<size>.import.json``) is checked against that record every time it is loaded: a copy
replaced or edited afterwards is refused naming the file, never trained on.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import importlib.util
import shutil
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedmedbench.workflow.io import atomic_path, file_digest, read_json, write_json

#: 2D single-label flags (multi-label ChestMNIST and the 3D sets are out of scope).
SUPPORTED_FLAGS = (
    "pathmnist",
    "dermamnist",
    "octmnist",
    "pneumoniamnist",
    "retinamnist",
    "breastmnist",
    "bloodmnist",
    "tissuemnist",
    "organamnist",
    "organcmnist",
    "organsmnist",
)
SIZES = (28, 64, 128, 224)
SPLITS = ("train", "val", "test")


class DataError(RuntimeError):
    """A data file is missing, corrupt or not in the expected format (message names it)."""


@dataclass(frozen=True)
class DatasetInfo:
    flag: str
    n_channels: int
    n_classes: int
    task: str
    n_samples: dict[str, int]
    class_names: tuple[str, ...]


@functools.cache
def medmnist_info_table() -> dict[str, dict]:
    """``medmnist.INFO`` (names, labels, split sizes, URLs and MD5s), read from the library's
    ``info.py`` alone: ``import medmnist`` runs the package's ``__init__``, which imports its torch
    datasets and scikit-learn evaluator, seconds in every job that only needs this table."""
    loaded = sys.modules.get("medmnist.info")
    if loaded is not None:
        return loaded.INFO
    spec = importlib.util.find_spec("medmnist")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the medmnist package is not installed (pip install medmnist; envs/requirements.txt)")
    path = Path(next(iter(spec.submodule_search_locations))) / "info.py"
    info_spec = importlib.util.spec_from_file_location("_fedmedbench_medmnist_info", path)
    if not path.is_file() or info_spec is None or info_spec.loader is None:
        raise DataError(f"{path}: cannot read the medmnist package's dataset table")
    module = importlib.util.module_from_spec(info_spec)
    info_spec.loader.exec_module(module)
    return module.INFO


def _info(flag: str) -> dict:
    if flag not in SUPPORTED_FLAGS:
        raise DataError(f"unknown or unsupported MedMNIST dataset '{flag}'; supported: {', '.join(SUPPORTED_FLAGS)}")
    return medmnist_info_table()[flag]


def dataset_info(flag: str) -> DatasetInfo:
    info = _info(flag)
    labels = info["label"]
    return DatasetInfo(
        flag=flag,
        n_channels=int(info["n_channels"]),
        n_classes=len(labels),
        task=info["task"],
        n_samples=dict(info["n_samples"]),
        class_names=tuple(labels[str(i)] for i in range(len(labels))),
    )


def official_filename(flag: str, size: int) -> str:
    """File name used by the MedMNIST release (``breastmnist.npz``, ``breastmnist_64.npz``)."""
    _check_size(size)
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def url_and_md5(flag: str, size: int) -> tuple[str, str]:
    info = _info(flag)
    _check_size(size)
    suffix = "" if size == 28 else f"_{size}"
    return info[f"url{suffix}"], info[f"MD5{suffix}"]


def _check_size(size: int) -> None:
    if size not in SIZES:
        raise DataError(f"MedMNIST size must be one of {SIZES}, got {size}")


def md5sum(path: Path) -> str:
    return file_digest(path, "md5")


class DownloadTooLargeError(DataError):
    """The server sent more than the file can be (a runaway stream): final, not retried."""


def max_npz_bytes(flag: str, size: int) -> int:
    """Upper bound on an official npz's size from the metadata: every image and label uncompressed,
    +10% and 1 MiB for the zip structure (the real files are compressed, so smaller)."""
    info = dataset_info(flag)
    per_sample = size * size * info.n_channels + 8
    return int(sum(info.n_samples.values()) * per_sample * 1.1) + (1 << 20)


def download(
    url: str,
    md5: str,
    target: str | Path,
    retries: int = 3,
    timeout: float = 60.0,
    backoff: float = 2.0,
    log=print,
    max_bytes: int | None = None,
) -> Path:
    """Stream ``url`` to ``target``, verify its MD5, move it into place atomically.

    Network errors and truncated or corrupted transfers are retried ``retries`` times;
    an HTTP 4xx error is final, and so is a stream longer than ``max_bytes`` (it is cut
    there, not written to the end of the disk). On failure nothing is left at ``target``.
    """
    target = Path(target)
    last_error: Exception | None = None
    for attempt in range(1, retries + 1):
        try:
            with atomic_path(target) as tmp:
                digest = hashlib.md5()
                with urllib.request.urlopen(url, timeout=timeout) as resp, open(tmp, "wb") as out:
                    expected = resp.headers.get("Content-Length")
                    if max_bytes is not None and expected is not None and int(expected) > max_bytes:
                        raise DownloadTooLargeError(f"{target.name}: {url} announces {expected} bytes, more than the "
                                                    f"{max_bytes} this file can be; refusing it")
                    received = 0
                    while block := resp.read(1 << 20):
                        received += len(block)
                        if max_bytes is not None and received > max_bytes:
                            raise DownloadTooLargeError(f"{target.name}: download from {url} passed {max_bytes} bytes, "
                                                        "more than this file can be (a runaway stream); stopped")
                        out.write(block)
                        digest.update(block)
                if expected is not None and received != int(expected):
                    raise DataError(f"{target.name}: truncated download from {url} ({received} of {expected} bytes)")
                if digest.hexdigest() != md5:
                    raise DataError(
                        f"{target.name}: MD5 mismatch for download from {url} "
                        f"(expected {md5}, got {digest.hexdigest()})"
                    )
            return target
        except DownloadTooLargeError:
            raise
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                raise DataError(f"{target.name}: download failed, {url} answered HTTP {exc.code}") from exc
            last_error = exc
        except (TimeoutError, urllib.error.URLError, http.client.HTTPException, ConnectionError, DataError) as exc:
            last_error = exc
        log(f"download attempt {attempt}/{retries} of {url} failed: {last_error}")
        if attempt < retries:
            time.sleep(backoff * attempt)
    raise DataError(f"{target.name}: download from {url} failed after {retries} attempts: {last_error}")


def copy_verified(source: str | Path, md5: str, target: str | Path) -> Path:
    """Copy a user-provided file into place after checking its MD5."""
    source, target = Path(source), Path(target)
    if not source.is_file():
        raise DataError(f"{source}: file not found (looked for it in data.medmnist_root)")
    actual = md5sum(source)
    if actual != md5:
        raise DataError(f"{source}: MD5 mismatch (expected {md5}, got {actual}); the file is corrupt or truncated")
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    return target


def fetch(flag: str, size: int, target: str | Path, root: str | Path | None = None, **kwargs) -> Path:
    """Get the official file for (flag, size): from ``root`` if given, else download it."""
    url, md5 = url_and_md5(flag, size)
    if root:
        return copy_verified(Path(root) / official_filename(flag, size), md5, target)
    kwargs.setdefault("max_bytes", max_npz_bytes(flag, size))
    return download(url, md5, target, **kwargs)


def verify_official(path: str | Path, flag: str, size: int) -> str:
    """MD5 of a file that claims to be the official (flag, size) npz, whoever put it there; raises if it differs."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    _, md5 = url_and_md5(flag, size)
    actual = md5sum(path)
    if actual != md5:
        raise DataError(f"{path}: MD5 mismatch with the official {official_filename(flag, size)} (expected {md5}, "
                        f"got {actual}); it is not the official MedMNIST file: delete it, or set data.origin: synthetic")
    return actual


def _check_labels(path: Path, key: str, labels: np.ndarray, num_classes: int | None) -> None:
    """Class labels are whole numbers in [0, num_classes): a float label is never truncated into a class."""
    split = key.removesuffix("_labels")
    if labels.dtype.kind not in "iub":
        if labels.dtype.kind != "f":
            raise DataError(f"{path}: {key} ({split} split) has dtype {labels.dtype}, expected integer class labels")
        bad = ~np.isfinite(labels) | (labels != np.round(labels))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: {key} ({split} split) has a non-integer label {labels[i].item()!r} at index {i} "
                            f"({int(bad.sum())} such); labels must be whole class numbers")
    if labels.size:
        low = labels < 0
        high = labels >= num_classes if num_classes is not None else np.zeros_like(low)
        if low.any() or high.any():
            i = int(np.flatnonzero(low | high)[0])
            rng = f"[0, {num_classes})" if num_classes is not None else ">= 0"
            raise DataError(f"{path}: {key} ({split} split) label {labels[i].item()!r} at index {i} is outside {rng}")


#: what follows a copy's stem in the name of its import record (``resources/user/<name>_<size>.import.json``)
IMPORT_RECORD_SUFFIX = ".import.json"


def import_record_path(path: str | Path) -> Path:
    """Where the SHA-256 of an imported copy is recorded: beside it, ``<stem>.import.json``."""
    path = Path(path)
    return path.with_name(path.stem + IMPORT_RECORD_SUFFIX)


def write_import_record(path: str | Path, source: str | Path) -> str:
    """Record the SHA-256 of the copy ``path`` (made of ``source``) beside it; return the digest."""
    digest = file_digest(path)
    write_json(import_record_path(path), {"file": Path(path).name, "sha256": digest, "source": str(source)})
    return digest


def check_import_record(path: str | Path) -> None:
    """A copy with an import record still has the recorded SHA-256 (a file without one is not an imported copy)."""
    record = import_record_path(path)
    if not record.is_file():
        return
    try:
        entry = read_json(record)
        recorded, source = entry["sha256"], entry.get("source", "its source")
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{path}: its import record {record} is unreadable; delete both and run snakemake again to "
                        "import the source again") from None
    if (actual := file_digest(path)) != recorded:
        raise DataError(f"{path}: SHA-256 {actual} differs from the {recorded} recorded when it was imported ({record}): "
                        f"the copy was replaced or edited since; delete it and run snakemake again to import {source} "
                        "again")


def load_npz(path: str | Path, expect_size: int | None = None, expect_channels: int | None = None,
             num_classes: int | None = None) -> dict[str, np.ndarray]:
    """Load and validate a MedMNIST-format npz; errors name the file and the problem.

    Labels must be whole numbers in ``[0, num_classes)`` (``num_classes`` when known). An imported copy
    must still have the SHA-256 recorded at its import (:func:`check_import_record`).

    Returns a dict ``{split}_images`` (uint8, N x H x W [x 3]) and ``{split}_labels``
    (int64, N), labels flattened from the official (N, 1) shape.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    check_import_record(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise DataError(f"{path}: corrupt or truncated npz ({type(exc).__name__}: {exc})") from exc
    out: dict[str, np.ndarray] = {}
    for split in SPLITS:
        ik, lk = f"{split}_images", f"{split}_labels"
        missing = [k for k in (ik, lk) if k not in arrays]
        if missing:
            raise DataError(f"{path}: missing key(s) {missing}; found {sorted(arrays)}")
        images, labels = arrays[ik], arrays[lk]
        if images.dtype != np.uint8:
            raise DataError(f"{path}: {ik} has dtype {images.dtype}, expected uint8")
        if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] != 3):
            raise DataError(f"{path}: {ik} has shape {images.shape}, expected N x H x W or N x H x W x 3")
        if images.shape[1] != images.shape[2]:
            raise DataError(f"{path}: {ik} images are not square: {images.shape}")
        if expect_size is not None and images.shape[1] != expect_size:
            raise DataError(f"{path}: {ik} are {images.shape[1]} px, expected {expect_size} px")
        channels = 1 if images.ndim == 3 else 3
        if expect_channels is not None and channels != expect_channels:
            raise DataError(f"{path}: {ik} have {channels} channel(s), expected {expect_channels}")
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise DataError(f"{path}: {lk} has shape {arrays[lk].shape}, expected ({images.shape[0]}, 1)")
        _check_labels(path, lk, labels, num_classes)
        out[ik] = images
        out[lk] = labels.astype(np.int64)
    return out


def require_nonempty(path: str | Path, data: dict[str, np.ndarray], splits: tuple[str, ...] = ("train", "test")) -> None:
    """Training needs a train split and every table needs a test split: an empty one is an error up front."""
    for split in splits:
        if len(data[f"{split}_labels"]) == 0:
            raise DataError(f"{path}: the {split} split is empty; a run needs {' and '.join(splits)} samples "
                            "(check the file, or data.synthetic.max_" + split + " for synthetic data)")


def label_dtype(labels: np.ndarray) -> np.dtype:
    """The smallest unsigned dtype that holds every label: uint8 as the official files have it, wider when a
    dataset has more than 256 classes (a cast to uint8 would wrap class 256 to 0 without an error)."""
    top = int(labels.max()) if labels.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def to_official_arrays(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of :func:`load_npz`'s label flattening: labels back to (N, 1), in a dtype that holds them
    (:func:`label_dtype`: uint8 for every official flag)."""
    out = {}
    every = np.concatenate([np.asarray(data[f"{split}_labels"]).reshape(-1) for split in SPLITS])
    dtype = label_dtype(every)
    for split in SPLITS:
        out[f"{split}_images"] = data[f"{split}_images"]
        out[f"{split}_labels"] = data[f"{split}_labels"].astype(dtype).reshape(-1, 1)
    return out
