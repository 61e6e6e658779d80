"""Bad-input catalogue: each case fails with a clear error naming the file or key, and leaves no partial output.

One representative case per catalogue entry (the per-module test files hold the variants).
"""

from __future__ import annotations

import copy
import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import split_labels
from helpers import surgical as SF
from snakemake.utils import validate

from fedmedbench import io
from fedmedbench import partition as P
from fedmedbench.data import medmnist, synthetic
from fedmedbench.data.medmnist import DataError
from fedmedbench.data.surgical.badfiles import BadFileError, DatasetNotFoundError
from fedmedbench.data.surgical.index import build_index
from fedmedbench.fl import checkpoint
from fedmedbench.fl.methods._sgd import StepHooks, local_loop
from fedmedbench.fl.registry import ClientContext, ClientData, TrainConfig, model_arrays
from fedmedbench.fl.training import NonFiniteLossError
from fedmedbench.models import build_model

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = str(ROOT / "config" / "schema.yaml")
MICRO = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


# ---------------------------------------------------------------- configuration (schema: the key is named)

def _cfg(path: list, value):
    cfg = copy.deepcopy(MICRO)
    node = cfg
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return cfg


CONFIG_CASES = [
    ("unknown method", ["studies", "micro", "methods"], ["fedmagic"], "methods"),
    ("unknown dataset", ["studies", "micro", "datasets"], ["catmnist"], "datasets"),
    ("unknown scheme", ["studies", "micro", "settings", "dir", "scheme"], "voronoi", "scheme"),
    ("zero clients", ["studies", "micro", "settings", "dir", "num_clients"], 0, "num_clients"),
    ("negative clients", ["studies", "micro", "settings", "dir", "num_clients"], -3, "num_clients"),
    ("alpha <= 0", ["studies", "micro", "settings", "dir", "params"], {"alpha": 0}, "alpha"),
    ("tau <= 0", ["studies", "micro", "early_stopping", "tau"], 0, "tau"),
    ("type error", ["studies", "micro", "train", "batch_size"], "thirty-two", "batch_size"),
]


@pytest.mark.parametrize("name,path,value,key", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_errors_name_the_key(name, path, value, key):
    with pytest.raises(Exception) as info:
        validate(_cfg(path, value), SCHEMA)
    assert key in str(info.value)


# ---------------------------------------------------------------- partitions


def test_more_clients_than_samples():
    labels = {"train": np.arange(5) % 2, "val": np.array([0, 1]), "test": np.array([0, 1])}
    with pytest.raises(P.PartitionError, match="num_clients=9 is larger than the 5 training samples"):
        P.build_partition(labels, "iid", 9, 0, {})


def test_min_size_impossible_does_not_loop_forever():
    rng = np.random.default_rng(0)
    labels = {"train": rng.integers(0, 7, 700), "val": rng.integers(0, 7, 50), "test": rng.integers(0, 7, 50)}
    with pytest.raises(P.PartitionError, match="min_size"):
        P.build_partition(labels, "dirichlet", 50, 0, {"alpha": 0.01, "min_size": 13})


def test_empty_class_a_client_prior_needs():
    """fls sampling with a class that has no training samples (here class 2 of 3)."""
    train = np.array([0, 0, 1, 1, 0, 1] * 5)
    priors = np.array([[0, 0, 1.0], [1.0, 0, 0]])
    with pytest.raises(P.PartitionError, match="class 2 has no training samples"):
        P._fls_fill(train, np.array([5, 5]), priors, np.random.default_rng(0))


# ---------------------------------------------------------------- MedMNIST files


@pytest.fixture
def npz(tmp_path, breast_arrays):
    path = tmp_path / "breastmnist_28.npz"
    io.write_npz(path, breast_arrays)
    return path


def test_truncated_npz(tmp_path, npz):
    bad = tmp_path / "cut.npz"
    bad.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    with pytest.raises(DataError, match=r"cut\.npz: corrupt or truncated"):
        medmnist.load_npz(bad)


def test_wrong_npz_keys(tmp_path, breast_arrays):
    path = tmp_path / "keys.npz"
    io.write_npz(path, {"x": breast_arrays["train_images"]})
    with pytest.raises(DataError, match=r"keys\.npz: missing key"):
        medmnist.load_npz(path)


def test_wrong_npz_shapes(tmp_path, breast_arrays):
    path = tmp_path / "shape.npz"
    io.write_npz(path, dict(breast_arrays, test_images=breast_arrays["test_images"][:, :20, :]))
    with pytest.raises(DataError, match=r"shape\.npz: test_images images are not square"):
        medmnist.load_npz(path)


def test_md5_mismatch_leaves_nothing(tmp_path, npz):
    out = tmp_path / "out"
    with pytest.raises(DataError, match="MD5 mismatch"):
        medmnist.copy_verified(npz, "0" * 32, out / "b.npz")
    assert leftovers(out) == []


# ---------------------------------------------------------------- surgical data


@pytest.fixture(scope="module")
def m2cai(tmp_path_factory):
    root = tmp_path_factory.mktemp("surg")
    cfg, folder = SF.make(root, "m2cai16")
    return cfg, root, folder


def _damaged(m2cai, tmp_path, damage):
    cfg, root, folder = m2cai
    raw = tmp_path / "raw"
    shutil.copytree(folder, raw / folder.name)
    path = damage(raw / folder.name)
    out = tmp_path / "index"
    with pytest.raises(BadFileError) as err:
        build_index("m2cai16", cfg, raw, out, policy="fail", log=lambda m: None)
    assert str(path) in str(err.value)
    assert not out.exists()
    return str(err.value)


def test_missing_surgical_dataset_folder(tmp_path, m2cai):
    cfg, _, _ = m2cai
    with pytest.raises(DatasetNotFoundError) as err:
        build_index("m2cai16", cfg, tmp_path / "nowhere", tmp_path / "index", log=lambda m: None)
    assert "m2cai16" in str(err.value) and str(tmp_path / "nowhere") in str(err.value)
    assert not (tmp_path / "index").exists()


def test_unreadable_frame(tmp_path, m2cai):
    def damage(folder):
        p = sorted((folder / "JPEGImages").glob("*.jpg"))[0]
        SF.garbage(p)
        return p

    assert "unreadable" in _damaged(m2cai, tmp_path, damage)


def test_malformed_voc_xml(tmp_path, m2cai):
    def damage(folder):
        p = sorted((folder / "Annotations").glob("*.xml"))[0]
        p.write_text("<annotation><object>")
        return p

    assert "does not parse" in _damaged(m2cai, tmp_path, damage)


def test_malformed_annotation_json(tmp_path):
    cfg, folder = SF.make(tmp_path / "raw", "cholectrack20")
    jf = sorted(folder.rglob("*.json"))[0]
    jf.write_text("{not json")
    with pytest.raises(BadFileError) as err:
        build_index("cholectrack20", cfg, tmp_path / "raw", tmp_path / "index", log=lambda m: None)
    assert str(jf) in str(err.value) and not (tmp_path / "index").exists()


def test_mask_of_wrong_size_and_out_of_map_label(tmp_path):
    import cv2

    cfg, folder = SF.make(tmp_path / "raw", "rarp")
    masks = sorted(p for p in folder.rglob("*.png") if "mask" in p.parent.name.lower())
    cv2.imwrite(str(masks[0]), np.zeros((7, 9), np.uint8))
    with pytest.raises(BadFileError) as err:
        build_index("rarp", cfg, tmp_path / "raw", tmp_path / "i1", log=lambda m: None)
    assert str(masks[0]) in str(err.value) and not (tmp_path / "i1").exists()
    shutil.rmtree(tmp_path / "raw")
    cfg, folder = SF.make(tmp_path / "raw", "rarp")
    masks = sorted(p for p in folder.rglob("*.png") if "mask" in p.parent.name.lower())
    m = cv2.imread(str(masks[0]), cv2.IMREAD_UNCHANGED)
    m[0, 0] = 77
    cv2.imwrite(str(masks[0]), m)
    with pytest.raises(BadFileError) as err:
        build_index("rarp", cfg, tmp_path / "raw", tmp_path / "i2", log=lambda m: None)
    assert str(masks[0]) in str(err.value) and "77" in str(err.value) and not (tmp_path / "i2").exists()


# ---------------------------------------------------------------- models and training


def test_missing_weights_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.pt: pretrained weights file not found"):
        build_model("cnn_small", 1, 2, 28, pretrained_path=str(tmp_path / "missing.pt"))


def test_nan_loss_stops_with_a_message():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.fill_(float("nan"))
    x = torch.randint(0, 255, (8, 1, 2, 2), dtype=torch.uint8)
    y = torch.randint(0, 3, (8,))
    ctx = ClientContext(pid=0, rnd=4, model=model, data=ClientData(x, y, x, y, x, y),
                        train=TrainConfig(rounds=5, local_epochs=1, batch_size=4, lr=0.1), device=torch.device("cpu"),
                        generator=torch.Generator().manual_seed(0), state={}, steps=2)
    with pytest.raises(NonFiniteLossError, match="non-finite training loss .* at round 4"):
        local_loop(ctx, StepHooks())


def test_client_raising_inside_training_is_covered_by_the_engine_test():
    """Marker: tests/test_engine.py::test_client_failure_fails_the_job_with_its_traceback runs a real
    Flower job whose client raises, and checks the job fails with the client's traceback and no metrics."""
    import test_engine

    assert hasattr(test_engine, "test_client_failure_fails_the_job_with_its_traceback")


def test_disk_full_during_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    state = checkpoint.RunState(round=1, arrays=model_arrays(torch.nn.Linear(2, 2)))
    checkpoint.save(tmp_path, state, "h")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, checkpoint.RunState(round=2, arrays=state.arrays), "h")
    monkeypatch.undo()
    assert checkpoint.load(tmp_path, "h").round == 1
    assert leftovers(tmp_path / "checkpoint") == ["server.pt"]


def test_unreadable_checkpoint_is_named(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "server.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match=r"server\.pt: unreadable checkpoint"):
        checkpoint.load(tmp_path, "h")


def test_partition_uses_a_source_the_run_lacks(tmp_path):
    from fedmedbench.fl.data import FederatedData

    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 30, "val": 6, "test": 6})
    doc = P.build_partition(split_labels(arrays), "domain", 2, 0, {"domains": ["clean", "noisy"]})
    io.write_json(tmp_path / "p.json", doc)
    with pytest.raises(KeyError, match=r"p\.json: partition uses data source\(s\) \['noisy'\]"):
        FederatedData(tmp_path / "p.json", {"clean": "x.npz"})
