"""Your own dataset: a `datasets:` entry, checked on import, trained from a config alone.

The end-to-end test packs scikit-learn's bundled digits (8x8, 10 classes) as a MedMNIST-layout
npz at 28 px and runs FedAvg and centralized on it through the workflow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import copy_workflow

from fedmedbench.data import user
from fedmedbench.data.medmnist import DataError

DIGITS = [str(d) for d in range(10)]


def pack_digits(path: Path, n_val: int = 200, n_test: int = 400) -> dict[str, np.ndarray]:
    """sklearn's digits as a MedMNIST-layout npz: uint8 28x28 images, (N, 1) labels, train/val/test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))  # 8 -> 24 px
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # 24 -> 28 px
    images = np.clip(images * 16, 0, 255).astype(np.uint8)
    labels = digits.target.astype(np.uint8).reshape(-1, 1)
    order = np.random.default_rng(0).permutation(len(labels))
    parts = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
    arrays = {}
    for split, idx in parts.items():
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images[idx], labels[idx]
    np.savez_compressed(path, **arrays)
    return arrays


def entry(path: Path, **kw) -> dict:
    return {"path": str(path), "labels": DIGITS, "task": "multi-class", "channels": 1, "sizes": [28], "md5": None, **kw}


def _write(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)
    return path


def test_valid_file_imports_unchanged(tmp_path):
    arrays = pack_digits(tmp_path / "digits.npz")
    counts = user.import_file(entry(tmp_path / "digits.npz"), 28, tmp_path / "out.npz")
    assert counts == {"train": 1197, "val": 200, "test": 400}
    assert (tmp_path / "out.npz").read_bytes() == (tmp_path / "digits.npz").read_bytes()
    assert user.info("digits", entry(tmp_path / "digits.npz")).class_names == tuple(DIGITS)
    assert arrays["train_images"].shape[1:] == (28, 28)


@pytest.mark.parametrize("change,needle", [
    (lambda a: a.__setitem__("val_labels", np.full_like(a["val_labels"], 10)), "val_labels go up to 10 but the dataset has 10 classes"),
    (lambda a: a.__setitem__("train_labels", a["train_labels"].astype(np.float32)), "train_labels has dtype float32"),
    (lambda a: a.__setitem__("test_images", a["test_images"][:0]) or a.__setitem__("test_labels", a["test_labels"][:0]),
     "test_images/test_labels are empty"),
    (lambda a: a.pop("val_images"), "missing key(s) ['val_images']"),
    (lambda a: a.__setitem__("train_images", a["train_images"].astype(np.float64)), "train_images has dtype float64"),
    (lambda a: a.__setitem__("train_images", np.repeat(a["train_images"][..., None], 3, axis=-1)), "expected 1"),
])
def test_bad_files_fail_naming_file_and_key(tmp_path, change, needle):
    arrays = dict(np.load(_write(tmp_path / "good.npz", pack_digits(tmp_path / "d.npz"))))
    change(arrays)
    bad = _write(tmp_path / "bad.npz", arrays)
    with pytest.raises(DataError) as info:
        user.import_file(entry(bad), 28, tmp_path / "out.npz")
    assert str(bad) in str(info.value) and needle in str(info.value)
    assert not (tmp_path / "out.npz").exists()


def test_md5_checked_only_when_given(tmp_path):
    pack_digits(tmp_path / "digits.npz")
    user.import_file(entry(tmp_path / "digits.npz"), 28, tmp_path / "a.npz")
    with pytest.raises(DataError, match="MD5 mismatch"):
        user.import_file(entry(tmp_path / "digits.npz", md5="0" * 32), 28, tmp_path / "b.npz")
    assert not (tmp_path / "b.npz").exists()


@pytest.mark.parametrize("name,cfg,needle", [
    ("Digits", {}, "datasets.Digits"),
    ("digits", {"task": "binary"}, "binary task has exactly 2 classes"),
    ("digits", {"task": "multi-label"}, "datasets.digits.task"),
    ("digits", {"labels": ["a", "a"]}, "must be distinct"),
    ("digits", {"sizes": [28, 64]}, "'{size}' in the path"),
    ("digits", {"path": "/data/{size.__class__}.npz"}, "datasets.digits.path': '/data/{size.__class__}.npz' holds braces"),
    ("digits", {"path": "/data/{0}_{size}.npz"}, "holds braces other than '{size}'"),
    ("digits", {"path": "/data/x}.npz"}, "holds braces other than '{size}'"),
])
def test_registry_errors_name_the_key(name, cfg, needle):
    cfg = {"path": "d.npz", **cfg}
    with pytest.raises(ValueError, match=None) as info:
        user.check_registry_entry(name, entry(Path(cfg.pop("path")), **cfg))
    assert needle in str(info.value)


def test_size_is_the_only_field_a_path_expands():
    """Replaced as text: str.format would read attributes (``{size.real}``) or fail with a raw error."""
    assert user.user_file({"path": "/d/x_{size}_{size}.npz"}, 64) == Path("/d/x_64_64.npz")
    assert user.user_file({"path": "/d/{size.real}.npz"}, 64) == Path("/d/{size.real}.npz")


def _import_config(work: Path, source: Path) -> str:
    cfg = {"device": "cpu", "data": {"origin": "real"},
           "datasets": {"digits": {"path": str(source), "labels": DIGITS, "task": "multi-class", "channels": 1,
                                   "sizes": [28]}},
           "studies": {"mine": {"datasets": ["digits"], "seeds": [0], "methods": ["fedavg"],
                                "settings": {"iid": {"scheme": "iid", "num_clients": 3}}}}}
    (work / "mine.yaml").write_text(yaml.safe_dump(cfg))
    return "mine.yaml"


def _snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "resources/user/digits_28.npz", "--cores", "1", *args],
                          cwd=work, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_imported_copy_follows_its_source(tmp_path):
    """A source edited in place (its modification time set back), moved, or missing: the copy is never stale."""
    import os

    work = copy_workflow(tmp_path / "wf")
    source = tmp_path / "digits.npz"
    first = pack_digits(source)
    assert _snakemake(work, "--configfile", _import_config(work, source)).returncode == 0
    copy = work / "resources" / "user" / "digits_28.npz"
    np.testing.assert_array_equal(np.load(copy)["train_labels"], first["train_labels"])

    # the same path, other contents, an older modification time (as `cp -p` or an archive restores it)
    stamp = source.stat().st_mtime_ns
    second = pack_digits(source, n_val=300)
    os.utime(source, ns=(stamp - 10**9, stamp - 10**9))
    proc = _snakemake(work, "--configfile", "mine.yaml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_array_equal(np.load(copy)["train_labels"], second["train_labels"])

    # a new path: imported from there
    moved = tmp_path / "moved" / "digits.npz"
    moved.parent.mkdir()
    third = pack_digits(moved, n_val=100)
    proc = _snakemake(work, "--configfile", _import_config(work, moved))
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_array_equal(np.load(copy)["train_labels"], third["train_labels"])

    # a missing source: an error naming it, even though an imported copy exists
    moved.unlink()
    proc = _snakemake(work, "-n", "--configfile", "mine.yaml")
    assert proc.returncode != 0
    assert f"config error in mine.yaml at 'datasets.digits.path': {moved} does not exist" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_digits_fedavg_and_centralized_from_a_config_alone(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    pack_digits(tmp_path / "digits.npz")
    cfg = {
        "device": "cpu",
        "data": {"origin": "real"},
        "datasets": {"digits": {"path": str(tmp_path / "digits.npz"), "labels": DIGITS, "task": "multi-class",
                                "channels": 1, "sizes": [28]}},
        "studies": {"mine": {
            "datasets": ["digits"], "seeds": [0], "methods": ["fedavg", "centralized"],
            "settings": {"iid": {"scheme": "iid", "num_clients": 3}},
            "train": {"rounds": 3, "local_epochs": 1, "batch_size": 32, "lr": 0.05, "momentum": 0.9},
            "report": {"metrics": ["global_accuracy", "global_f1"], "curve_metric": "global_accuracy"},
        }},
    }
    (work / "mine.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "mine.yaml"], cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "round 3/3" in proc.stderr  # the console shows each job's rounds
    table = pd.read_csv(work / "results" / "mine" / "tables" / "final_metrics.csv")
    assert set(table["method"]) == {"fedavg", "centralized"}
    assert (table["global_accuracy_mean"] > 0.5).all(), table  # 10 classes: chance is 0.1
    md = (work / "results" / "mine" / "tables" / "final_metrics.md").read_text()
    assert f"user data: {tmp_path / 'digits.npz'}" in md and "official MedMNIST" not in md
    part = pd.read_csv(work / "resources" / "partitions" / "mine" / "digits" / "iid" / "seed0.csv")
    assert [c for c in part if c.startswith("class_")] == [f"class_{i}" for i in range(10)]
    metrics = pd.read_csv(work / "results" / "mine" / "digits" / "iid" / "centralized" / "seed0" / "metrics.csv")
    assert metrics["global_accuracy"].iloc[-1] > 0.5
