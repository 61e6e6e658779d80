"""Loading validates the MedMNIST npz schema; the synthetic generator writes exactly that schema."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmedbench.data import medmnist, synthetic
from fedmedbench.data.medmnist import DataError
from fedmedbench.workflow import io


@pytest.mark.parametrize("flag,size", [("breastmnist", 28), ("pathmnist", 28), ("dermamnist", 64), ("bloodmnist", 64)])
def test_synthetic_matches_official_schema(flag, size):
    info = medmnist.dataset_info(flag)
    arrays = synthetic.generate(flag, size, seed=3, counts={"train": 30, "val": 10, "test": 20})
    for split, n in (("train", 30), ("val", 10), ("test", 20)):
        img, lab = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        expected = (n, size, size) if info.n_channels == 1 else (n, size, size, 3)
        assert img.shape == expected and img.dtype == np.uint8
        assert lab.shape == (n, 1) and lab.dtype == np.uint8
        assert lab.max() < info.n_classes
        assert len(np.unique(lab)) == min(n, info.n_classes)  # every class present


def test_synthetic_is_deterministic_and_seed_dependent():
    a = synthetic.generate("breastmnist", 28, seed=1, counts={"train": 20, "val": 5, "test": 5})
    b = synthetic.generate("breastmnist", 28, seed=1, counts={"train": 20, "val": 5, "test": 5})
    c = synthetic.generate("breastmnist", 28, seed=2, counts={"train": 20, "val": 5, "test": 5})
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["train_images"], c["train_images"])


def _cnn_accuracy(arrays, n_classes, epochs=8):
    from fedmedbench.fl.training import to_float
    from fedmedbench.models import build_model

    torch.manual_seed(0)
    to_t = lambda x: torch.from_numpy(x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2).copy())  # noqa: E731
    xtr, ytr = to_t(arrays["train_images"]), torch.from_numpy(arrays["train_labels"][:, 0].astype(np.int64))
    xte, yte = to_t(arrays["test_images"]), torch.from_numpy(arrays["test_labels"][:, 0].astype(np.int64))
    model = build_model("cnn_small", xtr.shape[1], n_classes, xtr.shape[-1])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        for i in range(0, len(ytr), 32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(to_float(xtr[i : i + 32], torch.device("cpu"))), ytr[i : i + 32]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(to_float(xte, torch.device("cpu"))).argmax(1) == yte).float().mean())


def test_synthetic_classes_are_learnable_and_difficulty_matters():
    counts = {"train": 400, "val": 10, "test": 200}
    easy = _cnn_accuracy(synthetic.generate("bloodmnist", 28, seed=0, counts=counts, difficulty=0.5), 8)
    hard = _cnn_accuracy(synthetic.generate("bloodmnist", 28, seed=0, counts=counts, difficulty=1.0), 8)
    assert easy > 0.6  # chance is 0.125
    assert hard < easy


def test_load_roundtrip(breast_npz, breast_arrays):
    data = medmnist.load_npz(breast_npz, expect_size=28, expect_channels=1)
    assert data["train_labels"].dtype == np.int64 and data["train_labels"].ndim == 1
    assert np.array_equal(medmnist.to_official_arrays(data)["test_labels"], breast_arrays["test_labels"])


def test_truncated_npz_is_named(tmp_path, breast_npz):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(breast_npz.read_bytes()[:500])
    with pytest.raises(DataError, match=r"bad\.npz: corrupt or truncated"):
        medmnist.load_npz(bad)


def test_not_an_npz(tmp_path):
    bad = tmp_path / "garbage.npz"
    bad.write_text("hello")
    with pytest.raises(DataError, match="garbage.npz"):
        medmnist.load_npz(bad)


def test_missing_file():
    with pytest.raises(DataError, match="nowhere.npz: file not found"):
        medmnist.load_npz("/nowhere.npz")


def test_wrong_keys_and_shapes(tmp_path, breast_arrays):
    no_val = {k: v for k, v in breast_arrays.items() if not k.startswith("val_")}
    io.write_npz(tmp_path / "a.npz", no_val)
    with pytest.raises(DataError, match=r"a\.npz: missing key"):
        medmnist.load_npz(tmp_path / "a.npz")
    wrong_dtype = dict(breast_arrays, train_images=breast_arrays["train_images"].astype(np.float32))
    io.write_npz(tmp_path / "b.npz", wrong_dtype)
    with pytest.raises(DataError, match="dtype float32"):
        medmnist.load_npz(tmp_path / "b.npz")
    wrong_labels = dict(breast_arrays, train_labels=breast_arrays["train_labels"][:-3])
    io.write_npz(tmp_path / "c.npz", wrong_labels)
    with pytest.raises(DataError, match="train_labels has shape"):
        medmnist.load_npz(tmp_path / "c.npz")
    io.write_npz(tmp_path / "d.npz", breast_arrays)
    with pytest.raises(DataError, match="28 px, expected 64"):
        medmnist.load_npz(tmp_path / "d.npz", expect_size=64)


def test_info_table_is_the_librarys_without_importing_the_library():
    """Each data job reads the dataset table; the medmnist package's own import pulls torch and scikit-learn."""
    import subprocess
    import sys
    from pathlib import Path

    import medmnist as library

    assert medmnist.medmnist_info_table() == library.INFO
    probe = ("import sys\nfrom fedmedbench.data.medmnist import dataset_info\n"
             "assert dataset_info('dermamnist').n_classes == 7\n"
             "print(sorted(m for m in ('medmnist', 'torch', 'sklearn', 'scipy') if m in sys.modules))")
    src = Path(__file__).resolve().parents[1] / "src"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout


def test_a_broken_medmnist_install_is_named(tmp_path, monkeypatch):
    """A medmnist package without its info.py: a DataError naming the file, not a bare traceback."""
    import importlib.machinery
    import importlib.util

    (tmp_path / "medmnist").mkdir()
    (tmp_path / "medmnist" / "__init__.py").write_text("")
    broken = importlib.machinery.ModuleSpec("medmnist", None, is_package=True)
    broken.submodule_search_locations = [str(tmp_path / "medmnist")]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: broken if name == "medmnist" else None)
    monkeypatch.delitem(__import__("sys").modules, "medmnist.info", raising=False)
    medmnist.medmnist_info_table.cache_clear()
    try:
        with pytest.raises(DataError, match=r"medmnist[/\\]info.py: cannot read"):
            medmnist.medmnist_info_table()
    finally:
        medmnist.medmnist_info_table.cache_clear()
