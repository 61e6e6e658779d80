"""Bad-input catalogue: each case fails with a clear error naming the file or key, and leaves no partial output.

One representative case per catalogue entry (the per-module test files hold the variants).
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from helpers import split_labels
from helpers import surgical as SF
from snakemake.utils import validate

from fedmedbench.data import medmnist, synthetic
from fedmedbench.data.medmnist import DataError
from fedmedbench.data.surgical.badfiles import BadFileError, DatasetNotFoundError
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import read_index
from fedmedbench.fl.api import ClientContext, ClientData, TrainConfig
from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.methods._sgd import StepHooks, local_loop
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.training import NonFiniteLossError
from fedmedbench.models import build_model
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io

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
    # a name outside the safe pattern (a well-formed unknown name is caught by the workflow's
    # cross-field check: tests/test_config.py)
    ("unsafe dataset name", ["studies", "micro", "datasets"], ["Cat MNIST!"], "datasets"),
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


def test_more_clients_than_held_out_samples_names_the_clients_left_without():
    labels = {"train": np.arange(12) % 2, "val": np.array([0, 1]), "test": np.array([0, 1, 1])}
    doc = P.build_partition(labels, "iid", 4, 0, {})
    empty = P.clients_without_holdout(doc)
    assert len(empty["val"]) == 2 and len(empty["test"]) == 1
    warning = P.holdout_warning(doc)
    assert f"client(s) {empty['val']} have no val data" in warning and "clients_without_local_scores" in warning
    assert P.holdout_shortfall(4, {"train": 12, "val": 2, "test": 3}) == ["val (2 samples)", "test (3 samples)"]
    assert P.holdout_shortfall(2, {"train": 12, "val": 2, "test": 3}) == []


def test_a_client_without_test_data_is_named_in_the_summary(tiny_run, tmp_path):
    """local_mean_* averages the clients that have a score; summary.json says which had none."""
    doc = json.loads((tiny_run / "p.json").read_text())
    doc["clients"][0]["test"] += doc["clients"][2]["test"]
    doc["clients"][2]["test"] = []
    io.write_json(tmp_path / "p.json", P.seal(doc))  # a partition built so
    spec = _spec(tiny_run, "no_test", method="fedavg", rounds=1)
    spec = dataclasses.replace(spec, partition_path=str(tmp_path / "p.json"), run_dir=str(tmp_path / "run"))
    _run_until(spec)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["clients_without_local_scores"] == [2]
    assert summary["clients_without_test_data"] == [2] and summary["clients_without_val_data"] == []
    clients = pd.read_csv(tmp_path / "run" / "client_metrics.csv")
    assert clients.loc[clients["client"] == 2, "local_accuracy"].isna().all()
    assert summary["final"]["local_mean_accuracy"] == pytest.approx(clients.loc[clients["client"] < 2, "local_accuracy"].mean())


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


def _edited_partition(tmp_path, breast_arrays, edit) -> tuple[Path, Path]:
    from fedmedbench.fl import data as fl_data

    npz = tmp_path / "b.npz"
    io.write_npz(npz, breast_arrays)
    doc = P.build_partition(split_labels(breast_arrays), "iid", 3, 0, {}, num_classes=2)
    edit(doc)
    path = tmp_path / "edited.json"
    io.write_json(path, P.seal(doc) if isinstance(doc, dict) else doc)  # as if built so: the checks past the digest
    fl_data.load_partition.cache_clear()
    return path, npz


PARTITION_EDITS = [
    ("index past the pool", lambda d: d["clients"][1]["train"].append(10**6),
     r"client 1 train index 1000000 is outside the pool of source 'base' \(0\.\.\d+\)"),
    ("negative index", lambda d: d["clients"][2]["val"].insert(0, -1), r"client 2 val index -1 is outside the pool"),
    ("test sample in a training list", lambda d: d["clients"][0]["train"].append(d["clients"][2]["test"][0]),
     r"client 0 trains on sample \d+ of source 'base', which is also in client 2 test list"),
    ("global test sample in a training list", lambda d: d["clients"][1]["train"].append(d["global_test"][0]["idx"][-1]),
     r"client 1 trains on sample \d+ of source 'base', which is also in (client \d test|global test set idx) list"),
    ("non-integer index", lambda d: d["clients"][0]["test"].__setitem__(0, 1.5), r"client 0 test list holds non-integer"),
    ("nested index", lambda d: d["clients"][0]["train"].__setitem__(0, [1]), r"client 0 train list must be a flat list"),
    ("nested list", lambda d: d["clients"][1]["val"].__setitem__(slice(None), [list(d["clients"][1]["val"])]),
     r"client 1 val list must be a flat list"),
]


@pytest.mark.parametrize("name,edit,needle", PARTITION_EDITS, ids=[c[0] for c in PARTITION_EDITS])
def test_hand_edited_partition_is_checked_on_load(tmp_path, breast_arrays, name, edit, needle):
    from fedmedbench.fl.data import FederatedData

    path, npz = _edited_partition(tmp_path, breast_arrays, edit)
    with pytest.raises(P.PartitionError, match=rf"{re.escape(str(path))}: {needle}"):
        FederatedData(path, {"base": str(npz)}).client(0)


MISSING_KEY_EDITS = [
    ("client source", lambda d: d["clients"][1].pop("source"), r"client 1 has no 'source' key \(each client holds "
                                                                r"source, train, val, test\)"),
    ("client train", lambda d: d["clients"][2].pop("train"), r"client 2 has no 'train' key"),
    ("client val", lambda d: d["clients"][0].pop("val"), r"client 0 has no 'val' key"),
    ("client test", lambda d: d["clients"][2].pop("test"), r"client 2 has no 'test' key"),
    ("global test idx", lambda d: d["global_test"][0].pop("idx"), r"global test entry 0 has no 'idx' key"),
    ("clients", lambda d: d.pop("clients"), r"the partition has no 'clients' key"),
    ("client not an object", lambda d: d["clients"].__setitem__(1, [1, 2]), r"client 1 must be an object with keys"),
    ("num_classes text", lambda d: d.__setitem__("num_classes", "eight"),
     r"'num_classes' must be a whole number >= 1, not 'eight'"),
]


@pytest.mark.parametrize("name,edit,needle", MISSING_KEY_EDITS, ids=[c[0] for c in MISSING_KEY_EDITS])
def test_a_partition_missing_a_key_is_refused_on_load(tmp_path, breast_arrays, name, edit, needle):
    """A client without its source, train, val or test key was a bare KeyError when the run first used it."""
    from fedmedbench.fl.data import FederatedData

    path, npz = _edited_partition(tmp_path, breast_arrays, edit)
    with pytest.raises(P.PartitionError, match=rf"^{re.escape(str(path))}: {needle}"):
        FederatedData(path, {"base": str(npz)})
    with pytest.raises(P.PartitionError, match=rf"^{re.escape(str(path))}: {needle}"):
        P.check_partition(json.loads(path.read_text()), {"base": 10}, str(path))


def test_an_unedited_partition_loads(tmp_path, breast_arrays):
    from fedmedbench.fl.data import FederatedData

    path, npz = _edited_partition(tmp_path, breast_arrays, lambda d: None)
    data = FederatedData(path, {"base": str(npz)})
    assert sum(len(data.client(i).train_y) for i in range(3)) == len(breast_arrays["train_labels"])


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


@pytest.mark.parametrize("name", ["rarp", "endovis2018", "endovis2017"])
def test_a_labelled_frame_whose_image_is_missing_is_a_bad_file(tmp_path, name):
    """Segmentation layouts list frames by their images: a mask left without its image was dropped silently."""
    cfg, folder = SF.make(tmp_path / "raw", name)
    frame_dirs = {"rarp": "frames", "endovis2018": "left_frames", "endovis2017": "left_frames"}
    mask_dirs = {"rarp": ("masks",), "endovis2018": ("labels",), "endovis2017": ("ground_truth", "PartsSegmentation")}
    masks = sorted(p for p in folder.rglob("*.png") if set(mask_dirs[name]) & set(p.parent.parts[-2:]))
    mask = masks[0]
    video = mask.parent
    while not (video / frame_dirs[name]).is_dir():
        video = video.parent
    image = next(p for p in (video / frame_dirs[name]).iterdir() if p.stem == mask.stem)
    image.unlink()
    with pytest.raises(BadFileError, match="label mask without its image") as err:
        build_index(name, cfg, tmp_path / "raw", tmp_path / "index", log=lambda m: None)
    assert str(mask) in str(err.value) and not (tmp_path / "index").exists()
    build_index(name, cfg, tmp_path / "raw", tmp_path / "index", policy="skip-and-report", log=lambda m: None)
    listed = pd.read_csv(tmp_path / "index" / "bad_files.csv")
    assert str(mask) in set(listed["path"])


@pytest.mark.parametrize("file_name,needle", [
    ("/etc/hostname", "is an absolute path"),
    ("../../../../etc/hostname", "climbs out of the dataset folder"),
    ("sub/../../../../p1_0001.png", "climbs out of the dataset folder"),
])
def test_coco_file_names_that_leave_the_dataset_folder_are_bad_files(tmp_path, file_name, needle):
    import json

    folder = SF.write_coco_folder(tmp_path)
    path = folder / "annotations" / "instances_train.json"
    doc = json.loads(path.read_text())
    doc["images"][0]["file_name"] = file_name
    path.write_text(json.dumps(doc))
    cfg = {"layout": "coco", "folder": folder.name}
    with pytest.raises(BadFileError, match=rf"file_name {re.escape(repr(file_name))} {needle}"):
        build_index("c", cfg, tmp_path, tmp_path / "idx", log=lambda m: None)
    build_index("c", cfg, tmp_path, tmp_path / "idx", policy="skip-and-report", log=lambda m: None)
    listed = pd.read_csv(tmp_path / "idx" / "bad_files.csv")
    assert list(listed["path"]) == [str(path)]
    assert len(read_index(tmp_path / "idx")[0]) == 5  # 6 frames, the one outside left out


# ---------------------------------------------------------------- models and training


def test_missing_weights_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.pt: pretrained weights file not found"):
        build_model("cnn_small", 1, 2, 28, pretrained_path=str(tmp_path / "missing.pt"))


def test_a_crafted_fedst_pretraining_file_is_refused_naming_it(tmp_path):
    """torch's own refusal suggests weights_only=False (which would run the payload): the message names the
    file and says what it is not, and nothing runs."""
    from fedmedbench.fl.methods._seg_shared import load_matching
    from fedmedbench.weights.safeload import WeightsError

    model = torch.nn.Linear(2, 2)
    crafted, marker = tmp_path / "pretrain.pt", tmp_path / "code-ran"
    torch.save({"weight": _RunsCode(marker)}, crafted)
    with pytest.raises(WeightsError) as info:
        load_matching(model, crafted)
    text = str(info.value)
    assert f"{crafted}: refused (FedST pre-training weights): not a plain weights file" in text
    assert "weights_only" not in text and info.value.__cause__ is None and not marker.exists()
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], listed)
    with pytest.raises(ValueError, match=rf"{re.escape(str(listed))}: not a plain weights file"):
        load_matching(model, listed)


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


def _fill_disk_while_writing_states(monkeypatch) -> None:
    """State files (server.pt, client states) get half their bytes written, then the disk is full."""
    from fedmedbench.fl.state import file_format as state_file

    class FullDisk:
        def __init__(self, fh) -> None:
            self.fh, self.left = fh, 100

        def write(self, data) -> int:
            part = memoryview(data).cast("B")[: self.left]
            self.fh.write(part)
            self.left -= len(part)
            if self.left <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return len(part)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.fh.close()

    monkeypatch.setattr(state_file, "open", lambda path, mode: FullDisk(open(path, mode)), raising=False)


def test_disk_full_during_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    state = checkpoint.RunState(round=1, arrays=model_arrays(torch.nn.Linear(2, 2)))
    checkpoint.save(tmp_path, state, "h")

    _fill_disk_while_writing_states(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, checkpoint.RunState(round=2, arrays=state.arrays), "h")
    monkeypatch.undo()
    assert checkpoint.load(tmp_path, "h").round == 1
    assert leftovers(tmp_path / "checkpoint") == ["client_rows.jsonl", "rows.jsonl", "server.pt"]


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
        FederatedData(tmp_path / "p.json", {"clean": "x.npz", "base": "x.npz"})


# ---------------------------------------------------------------- pickles a third-party library would load


class _RunsCode:
    """Unpickling this creates a folder: the proof that a file's pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _tiny_yolo_split(root: Path) -> Path:
    import cv2

    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for i in range(3):
        cv2.imwrite(str(root / "images" / "train" / f"f{i}.jpg"), np.full((32, 32, 3), 60 * i, np.uint8))
        (root / "labels" / "train" / f"f{i}.txt").write_text(f"0 0.5 0.5 0.{i + 1} 0.25\n")
    return root / "images" / "train"


def test_a_crafted_ultralytics_label_cache_is_rebuilt_not_unpickled(tmp_path):
    """Ultralytics reads ``labels.cache`` with allow_pickle=True; a killed run's work/ folder could hold a crafted
    one when the run resumes. Read through the workflow's format, the pickle is never loaded: the labels are
    scanned again and the cache rewritten."""
    from ultralytics.data.dataset import YOLODataset

    from fedmedbench.fl.tasks.detection import label_cache

    images = _tiny_yolo_split(tmp_path / "stage")
    cache = tmp_path / "stage" / "labels" / "train.cache"
    marker = tmp_path / "code-ran"
    with open(cache, "wb") as fh:
        np.save(fh, {"version": "1.0.3", "hash": "x", "labels": [_RunsCode(marker)]}, allow_pickle=True)
    label_cache.install()

    def dataset():
        return YOLODataset(img_path=str(images), data={"names": {0: "tool"}, "channels": 3}, task="detect",
                           augment=False, imgsz=32)

    first = dataset()
    assert not marker.exists()
    assert len(first.labels) == 3
    assert label_cache.load(cache)["results"] == (3, 0, 0, 0, 3)  # rewritten in the workflow's format
    with pytest.raises(label_cache.LabelCacheError, match=r"not a label cache of this workflow"):
        with open(cache, "wb") as fh:
            np.save(fh, {"labels": [_RunsCode(marker)]}, allow_pickle=True)
        label_cache.load(cache)
    assert not marker.exists()
    dataset()  # rebuilt again, then read back: the same labels as the first scan
    again = dataset()
    for a, b in zip(first.labels, again.labels, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == b[key].dtype and np.array_equal(value, b[key]), key
            else:
                assert value == b[key] and type(value) is type(b[key]), key


def test_label_cache_format_keeps_every_value(tmp_path):
    from fedmedbench.fl.tasks.detection import label_cache

    obj = {"labels": [{"shape": (480, 640), "cls": np.array([[1.0], [2.0]], np.float32), "segments": [],
                       "keypoints": None, "normalized": True, "empty": np.zeros((0, 4), np.float32)}],
           "results": (1, 0, 0, 0, 1), "msgs": ["a", "b"], "n": np.int64(7), "ratio": 0.5}
    label_cache.dump(obj, tmp_path / "x.cache")
    back = label_cache.load(tmp_path / "x.cache")
    assert back["labels"][0]["shape"] == (480, 640) and back["results"] == (1, 0, 0, 0, 1)
    assert back["n"] == 7 and type(back["n"]) is np.int64 and back["msgs"] == ["a", "b"] and back["ratio"] == 0.5
    cls = back["labels"][0]["cls"]
    assert cls.dtype == np.float32 and cls.shape == (2, 1) and cls.flags.writeable
    assert back["labels"][0]["empty"].shape == (0, 4) and back["labels"][0]["keypoints"] is None
    with pytest.raises(TypeError, match="object array"):
        label_cache.dump({"x": np.array([None], dtype=object)}, tmp_path / "y.cache")


# ---------------------------------------------------------------- labels, splits and official files


def _with_labels(tmp_path, breast_arrays, split, labels):
    arrays = dict(breast_arrays)
    arrays[f"{split}_labels"] = np.asarray(labels).reshape(-1, 1)
    path = tmp_path / "labels.npz"
    io.write_npz(path, arrays)
    return path


def _labels_like(breast_arrays, split, index, value, dtype=np.float64):
    labels = breast_arrays[f"{split}_labels"].reshape(-1).astype(dtype)
    labels[index] = value
    return labels


LABEL_CASES = [
    ("float label truncated before", "train", 3, 0.99, np.float64, r"train split\) has a non-integer label 0\.99 at index 3"),
    ("nan label", "val", 0, np.nan, np.float64, r"val split\) has a non-integer label nan at index 0"),
    ("label above the classes", "test", 5, 7, np.int64, r"test split\) label 7 at index 5 is outside \[0, 2\)"),
    ("negative label", "train", 1, -1, np.int64, r"train split\) label -1 at index 1 is outside"),
]


@pytest.mark.parametrize("name,split,index,value,dtype,needle", LABEL_CASES, ids=[c[0] for c in LABEL_CASES])
def test_bad_labels_name_file_split_and_index(tmp_path, breast_arrays, name, split, index, value, dtype, needle):
    path = _with_labels(tmp_path, breast_arrays, split, _labels_like(breast_arrays, split, index, value, dtype))
    with pytest.raises(DataError, match=needle) as err:
        medmnist.load_npz(path, num_classes=2)
    assert str(path) in str(err.value)


def test_whole_float_labels_are_accepted_as_classes(tmp_path, breast_arrays):
    labels = breast_arrays["train_labels"].reshape(-1).astype(np.float32)
    out = medmnist.load_npz(_with_labels(tmp_path, breast_arrays, "train", labels), num_classes=2)
    assert out["train_labels"].dtype == np.int64
    np.testing.assert_array_equal(out["train_labels"], breast_arrays["train_labels"].reshape(-1))


def test_labels_past_255_survive_every_write(tmp_path, breast_arrays):
    """A 300-class dataset: classes 256..299 must not wrap to 0..43 when a derived file (client domain) is written."""
    rng = np.random.default_rng(0)
    data = {}
    for split in medmnist.SPLITS:
        n = len(breast_arrays[f"{split}_labels"])
        data[f"{split}_images"] = breast_arrays[f"{split}_images"]
        data[f"{split}_labels"] = rng.integers(200, 300, n)
    path = tmp_path / "wide.npz"
    io.write_npz(path, medmnist.to_official_arrays(data))
    back = medmnist.load_npz(path, num_classes=300)
    for split in medmnist.SPLITS:
        np.testing.assert_array_equal(back[f"{split}_labels"], data[f"{split}_labels"])
    assert medmnist.to_official_arrays(back)["train_labels"].dtype == np.uint16
    # the official flags keep uint8 labels (their derived files stay byte-identical)
    official = medmnist.to_official_arrays(medmnist.load_npz(_with_labels(tmp_path, breast_arrays, "train",
                                                                          breast_arrays["train_labels"])))
    assert official["train_labels"].dtype == breast_arrays["train_labels"].dtype == np.uint8


def test_empty_test_split_is_an_error_before_training(tmp_path, breast_arrays):
    arrays = dict(breast_arrays, test_images=breast_arrays["test_images"][:0], test_labels=breast_arrays["test_labels"][:0])
    path = tmp_path / "empty.npz"
    io.write_npz(path, arrays)
    data = medmnist.load_npz(path)
    with pytest.raises(DataError, match=r"empty\.npz: the test split is empty"):
        medmnist.require_nonempty(path, data)


def test_a_file_placed_by_hand_is_verified_against_the_official_md5(tmp_path, npz):
    """A file dropped into resources/medmnist/ never went through the download: the verify rule checks it."""
    with pytest.raises(DataError, match=r"breastmnist_28\.npz: MD5 mismatch with the official breastmnist\.npz"):
        medmnist.verify_official(npz, "breastmnist", 28)
    rules = (ROOT / "rules" / "data.smk").read_text()
    assert "rule verify_medmnist" in rules and '{dataset}_{size}.npz.verified' in rules
    # every reader of an official file depends on its marker, through the named input functions of common.smk
    common = (ROOT / "rules" / "common.smk").read_text()
    for smk, fn in (("train.smk", "run_verified"), ("partition.smk", "partition_sources")):
        assert fn in (ROOT / "rules" / smk).read_text()
        body = common.split(f"def {fn}(", 1)[1].split("\ndef ", 1)[0]
        assert "verified_marker(" in body, fn


def test_endless_download_stream_is_cut_at_the_file_bound(tmp_path):
    import http.server
    import threading

    class Endless(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - no Content-Length, never ends on its own
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/x.npz"
        with pytest.raises(medmnist.DownloadTooLargeError, match=r"passed 3000000 bytes"):
            medmnist.download(url, "0" * 32, tmp_path / "x.npz", retries=3, backoff=0, max_bytes=3_000_000, log=lambda m: None)
    finally:
        httpd.shutdown()
    assert leftovers(tmp_path) == []
    assert medmnist.max_npz_bytes("breastmnist", 28) < 2_000_000  # 780 images of 28x28: the bound is tight


def test_medmnist_root_with_synthetic_origin_is_warned_about():
    from fedmedbench.config.check import ignored_settings

    warnings = ignored_settings({"data": {"origin": "synthetic", "medmnist_root": "/data/medmnist"}})
    assert len(warnings) == 1 and "data.medmnist_root" in warnings[0] and "ignored" in warnings[0]
    assert ignored_settings({"data": {"origin": "real", "medmnist_root": "/data/medmnist"}}) == []


def test_a_derived_copy_is_tied_to_its_source(tmp_path, breast_arrays):
    """A user dataset's import is keyed by its source's path and content: an edit that keeps the size and
    modification time still changes the key; a missing source is named (tests/test_user_dataset.py runs
    both through Snakemake)."""
    from fedmedbench.data import user

    source = tmp_path / "mine.npz"
    io.write_npz(source, breast_arrays)
    cfg = {"path": str(source), "labels": ["a", "b"], "task": "binary", "channels": 1, "sizes": [28]}
    first = user.source_fingerprint("mine", cfg, 28, tmp_path / "cache")
    assert first == user.source_fingerprint("mine", cfg, 28, tmp_path / "cache")  # remembered, same answer
    stat = source.stat()
    data = bytearray(source.read_bytes())
    data[-30] ^= 1  # one bit, same length
    source.write_bytes(bytes(data))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = user.source_fingerprint("mine", cfg, 28, tmp_path / "cache")
    assert second["path"] == first["path"] and second["sha256"] != first["sha256"]
    source.unlink()
    with pytest.raises(DataError, match=rf"'datasets\.mine\.path': {re.escape(str(source))} does not exist"):
        user.source_fingerprint("mine", cfg, 28, tmp_path / "cache")


def test_a_missing_source_is_a_config_error_naming_the_config_file(tmp_path):
    """Planning reports a missing user dataset source as one line naming the config file that sets the path."""
    from fedmedbench.data import user
    from fedmedbench.workflow.diagnostics import as_config_error, config_error_line

    config = tmp_path / "mine.yaml"
    config.write_text("datasets:\n  mine:\n    path: gone.npz\n")
    with pytest.raises(DataError) as caught:
        user.existing_source("mine", {"path": str(tmp_path / "gone.npz")}, 28)
    err = as_config_error(caught.value)
    assert err is not None and err.key == "datasets.mine.path"
    assert config_error_line(err, [config]).startswith(f"config error in {config} at 'datasets.mine.path': ")


# ---------------------------------------------------------------- config files (read strictly, file:line)


def test_duplicate_yaml_key_is_rejected_with_its_line(tmp_path):
    from fedmedbench.config.check import ConfigFileError, check_file

    path = tmp_path / "dup.yaml"
    path.write_text("device: cpu\nstudies:\n  s:\n    seeds: [0]\n    seeds: [1]\n")
    with pytest.raises(ConfigFileError, match=r"dup\.yaml:5:5: duplicate key 'seeds' \(first defined at line 4\)"):
        check_file(path)


def test_invalid_yaml_names_file_and_line(tmp_path):
    from fedmedbench.config.check import ConfigFileError, check_file

    path = tmp_path / "broken.yaml"
    path.write_text("device: cpu\nstudies:\n  x: [1\n  y: 2\n")
    with pytest.raises(ConfigFileError, match=r"broken\.yaml:4:\d+: "):
        check_file(path)


def test_exponent_floats_are_numbers_where_the_schema_wants_one(tmp_path):
    from fedmedbench.config.check import check_file, coerce_numbers

    path = tmp_path / "c.yaml"
    path.write_text("studies:\n  micro:\n    train: {lr: 5e-2}\n")
    assert check_file(path)["studies"]["micro"]["train"]["lr"] == 0.05  # the strict reader reads YAML 1.2 floats
    cfg = copy.deepcopy(MICRO)
    cfg["studies"]["micro"]["train"]["lr"] = "5e-2"  # what Snakemake's YAML 1.1 reader hands over
    cfg["studies"]["micro"]["model"] = {"pretrained_path": "1e3"}  # a string key keeps its text
    assert coerce_numbers(cfg, SCHEMA) == ["studies.micro.train.lr"]
    validate(cfg, SCHEMA)
    assert cfg["studies"]["micro"]["train"]["lr"] == 0.05 and cfg["studies"]["micro"]["model"]["pretrained_path"] == "1e3"
    cfg["studies"]["micro"]["train"]["lr"] = "fast"
    assert coerce_numbers(cfg, SCHEMA) == []  # not a number: left for the schema to name


def _alias_bomb(path: Path, as_mappings: bool) -> Path:
    """9 levels of 10 aliases: 10^9 values once expanded, a few hundred bytes of text."""
    if as_mappings:
        lines = ["a0: &a0 {" + ", ".join(f"k{j}: lol" for j in range(10)) + "}"]
        lines += [f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + "}" for i in range(1, 10)]
    else:
        lines = ["a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("as_mappings", [False, True], ids=["lists", "mappings"])
def test_alias_bomb_is_refused_at_once(tmp_path, as_mappings):
    import time

    from fedmedbench.config.check import MAX_EXPANDED_NODES, ConfigFileError, check_file

    start = time.monotonic()
    with pytest.raises(ConfigFileError, match=rf"bomb\.yaml: its anchors and aliases .* more than {MAX_EXPANDED_NODES:,}"):
        check_file(_alias_bomb(tmp_path / "bomb.yaml", as_mappings))
    assert time.monotonic() - start < 5


@pytest.mark.slow
@pytest.mark.parametrize("as_mappings", [False, True], ids=["lists", "mappings"])
def test_alias_bomb_stops_planning_with_the_file_named(tmp_path, as_mappings):
    """Through Snakemake: a list bomb used to be expanded by the schema check's error message, a mapping bomb by
    Snakemake's own config merge while it parses its command line (no message, memory rising)."""
    import subprocess
    import sys

    from fedmedbench.config.check import MAX_EXPANDED_NODES

    bomb = _alias_bomb(tmp_path / "bomb.yaml", as_mappings=as_mappings)
    try:
        proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "--configfile", str(bomb)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("planning with an alias bomb did not stop within 60 s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert out.count(f"config error: {bomb}: its anchors and aliases (&name, *name) expand to more than "
                     f"{MAX_EXPANDED_NODES:,} values") == 1


def test_a_config_nested_past_pythons_recursion_limit_is_one_line(tmp_path, capsys):
    """PyYAML composes recursively: 5,000 nested lists were a RecursionError (from the profile's check, Snakemake's
    'Couldn't parse config file' about its own profile)."""
    from fedmedbench.config.check import ConfigFileError, check_file
    from fedmedbench.config.cmdline import check_command_line

    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigFileError, match=r"deep\.yaml: its lists or mappings nest too deeply to read"):
        check_file(deep)
    with pytest.raises(SystemExit):
        check_command_line(["--configfile", str(deep)])
    assert capsys.readouterr().err.startswith(f"config error: {deep}: its lists or mappings nest too deeply")
    deep_json = tmp_path / "deep.json"  # Python's JSON reader recurses too
    deep_json.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigFileError, match=r"deep\.json: its lists or mappings nest too deeply to read"):
        check_file(deep_json)


def test_yaml_merge_keys_are_accepted_and_duplicates_still_refused(tmp_path):
    from fedmedbench.config.check import ConfigFileError, check_file

    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {lr: 0.1, batch_size: 32}\ntrain:\n  <<: *base\n  lr: 0.01\n")
    assert check_file(path)["train"] == {"lr": 0.01, "batch_size": 32}  # the mapping's own key wins
    path.write_text("base: &base {lr: 0.1}\ntrain:\n  <<: *base\n  lr: 0.01\n  lr: 0.02\n")
    with pytest.raises(ConfigFileError, match=r"merge\.yaml:5:3: duplicate key 'lr'"):
        check_file(path)


@pytest.mark.parametrize("path,text", [
    (["studies", "micro", "settings", "dir", "params", "alpha"], ".nan"),
    (["studies", "micro", "train", "lr"], ".inf"),
    (["studies", "micro", "train", "local_epochs"], "-.inf"),
    (["studies", "micro", "train", "lr"], "1e999"),  # YAML 1.1 text, made a number by coerce_numbers
])
def test_non_finite_numbers_are_refused_naming_the_key(path, text):
    from fedmedbench.config.check import coerce_numbers, refuse_non_finite

    cfg = _cfg(path, yaml.safe_load(text))  # as Snakemake's YAML 1.1 reader hands it over
    coerce_numbers(cfg, SCHEMA)
    with pytest.raises(ValueError, match=rf"config error at '{re.escape('.'.join(path))}': must be a finite number"):
        refuse_non_finite(cfg)


def test_nan_passes_the_schema_alone():
    """Why the extra check exists: every range check of the schema is false for NaN."""
    validate(_cfg(["studies", "micro", "settings", "dir", "params"], {"alpha": float("nan")}), SCHEMA)


def test_a_target_read_as_a_config_file_says_to_put_targets_first(tmp_path, capsys):
    """``snakemake --configfile c.yaml all`` reads 'all' as a second config file (Snakemake stops on it before the
    workflow runs); the strict reader and ``python -m fedmedbench.config.check`` say what happened."""
    from fedmedbench.config.check import ConfigFileError, check_file, main

    with pytest.raises(ConfigFileError, match=r"all: cannot read the config file .*; if 'all' is a target, put "
                                              r"targets before --configfile \(snakemake all --configfile FILE\)"):
        check_file("all")
    table = tmp_path / "table1.md"
    with pytest.raises(ConfigFileError, match="put targets before --configfile"):
        check_file(table)
    assert main([str(ROOT / "config" / "config.yaml"), "all"]) == 1
    err = capsys.readouterr().err
    assert err.count("put targets before --configfile") == 1 and "Traceback" not in err
    with pytest.raises(ConfigFileError) as missing:
        check_file(tmp_path / "mine.yaml")
    assert "put targets" not in str(missing.value)  # a missing .yaml is a missing config, not a misplaced target


def test_a_target_after_configfile_is_one_line_before_snakemake_reads_it(tmp_path, capsys):
    """Snakemake opens every word after ``--configfile`` while it parses its command line, before the workflow runs;
    the check the workflow profile runs first names the word and says where targets go (no traceback)."""
    from fedmedbench.config.cmdline import check_command_line, configfiles

    study = str(ROOT / "config" / "studies" / "gpaf.yaml")
    assert configfiles(["--cores", "1", "--configfile", study, "all"]) == [study, "all"]
    assert configfiles(["--configfile", study, "--", "all"]) == [study]  # '--' ends the config files
    table = tmp_path / "table1.md"
    for target in ("all", str(table)):
        with pytest.raises(SystemExit) as stop:
            check_command_line(["--cores", "1", "--configfile", study, target])
        assert stop.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(f"config error: {target}: cannot read the config file") and len(err.splitlines()) == 1
        assert err.count("put targets before --configfile") == 1 and f"--configfile FILE -- {target}" in err
    table.write_text("| method | acc |\n|---|---|\n| fedavg | 0.9 |\n")  # a built target is read as YAML
    with pytest.raises(SystemExit):
        check_command_line(["--configfile", study, str(table)])
    assert "table1.md:1:3:" in (err := capsys.readouterr().err) and "put targets before --configfile" in err
    figure = tmp_path / "fig5.png"  # a binary target is not UTF-8: Snakemake's reading of it was a traceback
    figure.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(SystemExit):
        check_command_line(["--configfile", study, str(figure)])
    err = capsys.readouterr().err
    assert err.startswith(f"config error: {figure}: not a text file (byte 0 is not UTF-8); if '{figure}' is a target")
    assert len(err.splitlines()) == 1
    rows = tmp_path / "rows.json"  # a JSON list: Snakemake's own message named no file
    rows.write_text("[1, 2]")
    with pytest.raises(SystemExit):
        check_command_line(["--configfile", study, str(rows)])
    err = capsys.readouterr().err
    assert err.startswith(f"config error: {rows}: a config file holds settings (key: value) at its top level, not a "
                          f"list; if '{rows}' is a target") and len(err.splitlines()) == 1
    table.write_text("a note\n")  # text YAML reads as one string: not a config either
    with pytest.raises(SystemExit):
        check_command_line(["--configfile", study, str(table)])
    assert "not a str; if" in capsys.readouterr().err
    check_command_line(["--configfile", study, "--", "all"])  # targets after '--' pass
    check_command_line(["all", "--configfile", study])
    assert capsys.readouterr().err == ""


def test_the_workflow_profile_checks_the_command_line_first(monkeypatch):
    """Snakemake reads the workflow profile (through YTE) before the --configfile files: that is where the check runs."""
    import yte

    import fedmedbench.config.cmdline as argcheck

    calls = []
    monkeypatch.setattr(argcheck, "check_command_line", lambda: calls.append(1))
    with (ROOT / "profiles" / "default" / "config.yaml").open() as f:
        settings = yte.process_yaml(f, require_use_yte=True)
    assert calls == [1] and settings == {"cores": "all", "rerun-incomplete": True}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["all", "results/gpaf/table1.md"])
def test_snakemake_with_a_target_after_configfile_prints_one_line(target):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile",
                           "config/studies/gpaf.yaml", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert out.count(f"config error: {target}: cannot read the config file") == 1
    assert out.count("put targets before --configfile") == 1


def test_workflow_checks_its_config_files_strictly():
    snakefile = (ROOT / "Snakefile").read_text()
    assert snakefile.index("check_files(") < snakefile.index('configfile: "config/config.yaml"')
    common = (ROOT / "rules" / "common.smk").read_text()
    assert common.index("coerce_numbers(config") < common.index("refuse_non_finite(config)") < common.index("validate_config(config")


# ---------------------------------------------------------------- surgical: names, JSON structure, fps, collisions


@pytest.fixture(scope="module")
def ct20(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct20")
    cfg, folder = SF.make(root, "cholectrack20")
    return cfg, folder


def _ct20_damaged(ct20, tmp_path, edit, policy="fail"):
    import json

    cfg, folder = ct20
    raw = tmp_path / "raw"
    shutil.copytree(folder, raw / folder.name)
    label = sorted((raw / folder.name).rglob("*.json"))[0]
    label.write_text(json.dumps(edit(json.loads(label.read_text()))))
    return cfg, raw, label


def _first_frame(doc):
    return next(iter(doc["annotations"]))


CT20_CASES = [
    ("negative fps", lambda d: {**d, "video": {**d["video"], "fps": -25}}, "video.fps"),
    ("zero fps", lambda d: {**d, "video": {**d["video"], "fps": 0}}, "video.fps"),
    ("text fps", lambda d: {**d, "video": {**d["video"], "fps": "fast"}}, "video.fps"),
    ("top level list", lambda d: [d], "top level is a list"),
    ("annotations not an object", lambda d: {**d, "annotations": [1, 2]}, "field 'annotations'"),
    ("records not a list", lambda d: {**d, "annotations": {_first_frame(d): "grasper"}}, "is not a list of objects"),
    ("record not an object", lambda d: {**d, "annotations": {_first_frame(d): [5]}}, "is not a list of objects"),
    ("video not an object", lambda d: {**d, "video": "VID01"}, "field 'video'"),
    ("width not a number", lambda d: {**d, "video": {**d["video"], "width": "wide"}}, "video.width"),
    ("tool ids not integers", lambda d: {**d, "categories": {"tools": {"x": "grasper"}}}, "categories.tools"),
    ("instrument not an integer",
     lambda d: {**d, "annotations": {_first_frame(d): [{"instrument": "abc", "tool_bbox": [0.1, 0.1, 0.2, 0.2]}]}},
     "'instrument' = 'abc'"),
]


@pytest.mark.parametrize("name,edit,needle", CT20_CASES, ids=[c[0] for c in CT20_CASES])
def test_cholectrack20_json_problems_are_bad_files_naming_the_field(ct20, tmp_path, name, edit, needle):
    cfg, raw, label = _ct20_damaged(ct20, tmp_path, edit)
    with pytest.raises(BadFileError) as err:
        build_index("cholectrack20", cfg, raw, tmp_path / "index", policy="fail", log=lambda m: None)
    assert str(label) in str(err.value) and needle in str(err.value)
    assert not (tmp_path / "index").exists()


def test_cholectrack20_bad_json_is_skipped_under_skip_and_report(ct20, tmp_path):
    cfg, raw, label = _ct20_damaged(ct20, tmp_path, lambda d: {**d, "video": {**d["video"], "fps": -1}})
    import pandas as pd

    build_index("cholectrack20", cfg, raw, tmp_path / "index", policy="skip-and-report", log=lambda m: None)
    report = pd.read_csv(tmp_path / "index" / "bad_files.csv")
    df = pd.read_parquet(tmp_path / "index" / "index.parquet")
    assert str(label) in set(report["path"]) and label.parent.name not in set(df["video_id"])
    assert (df["timestamp_s"] >= 0).all()


def _yolo(tmp_path):
    folder = SF.write_yolo_folder(tmp_path)
    return {"layout": "yolo", "folder": folder.name}, folder


YOLO_NAMES = [
    ("a single string", "names: grasper\n", "field 'names' is a str"),
    ("non-integer keys", "names: {a: grasper, b: hook}\n", "non-integer class ids"),
    ("ids with a gap", "names: {0: grasper, 2: hook}\n", "are not 0..1"),
    ("names not strings", "names: [1, 2]\n", "non-empty class name strings"),
    ("no names", "nc: 3\n", "no readable 'names'"),
]


@pytest.mark.parametrize("name,text,needle", YOLO_NAMES, ids=[c[0] for c in YOLO_NAMES])
def test_yolo_names_are_validated(tmp_path, name, text, needle):
    cfg, folder = _yolo(tmp_path)
    (folder / "data.yaml").write_text(text)
    with pytest.raises(BadFileError) as err:
        build_index("yolo_ds", cfg, tmp_path, tmp_path / "index", log=lambda m: None)
    assert str(folder / "data.yaml") in str(err.value) and needle in str(err.value)
    assert not (tmp_path / "index").exists()


def test_yolo_binary_label_file_is_a_bad_file(tmp_path):
    cfg, folder = _yolo(tmp_path)
    lab = folder / "labels" / "train" / "caseA_00010.txt"
    lab.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(BadFileError) as err:
        build_index("yolo_ds", cfg, tmp_path, tmp_path / "index", log=lambda m: None)
    assert str(lab) in str(err.value) and "not a" in str(err.value)


def test_video_folders_colliding_after_sanitising_fail_naming_both(tmp_path):
    cfg, folder = SF.make(tmp_path / "raw", "rarp")
    videos = sorted(p for p in (folder / "train").iterdir() if p.is_dir())
    videos[0].rename(folder / "train" / "case 7")
    videos[1].rename(folder / "train" / "case-7")
    with pytest.raises(BadFileError) as err:
        build_index("rarp", cfg, tmp_path / "raw", tmp_path / "index", log=lambda m: None)
    assert "'case 7'" in str(err.value) and "'case-7'" in str(err.value)
    assert not (tmp_path / "index").exists()


# ---------------------------------------------------------------- faults: resume state, disk, finished runs


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Data and partition of a 3-client job small enough to run many times."""
    d = tmp_path_factory.mktemp("faults")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 90, "val": 15, "test": 30})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "iid", 3, 0, {}, num_classes=2))
    return d


def _spec(d: Path, name: str, method="scaffold", rounds=5, **kw):
    from fedmedbench.fl.spec import RunSpec

    return RunSpec(run_dir=str(d / name), study="t", dataset="breastmnist", setting="iid", method=method, seed=0,
                   partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28,
                   train={"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.0},
                   device="cpu", threads=1, **kw)


class _Killed(Exception):
    pass


def _run_until(spec, stop_after: int | None = None):
    """Run a job in-process; with ``stop_after`` it dies right after that round's checkpoint (as a kill would)."""
    from fedmedbench.fl.engine import federation as fed

    spec = fed.resolve_data_shapes(spec)
    if getattr(spec, "resume", "auto") != "auto":
        checkpoint.prepare(spec.run_dir, spec.resume)
    federation = fed.Federation(spec, log=lambda m: None)

    class Transport(fed.InProcessTransport):
        def train(self, rnd, steps, arrays, broadcast):
            if stop_after is not None and rnd > stop_after:
                raise _Killed
            return super().train(rnd, steps, arrays, broadcast)

    try:
        state = federation.run(Transport(spec))
    except _Killed:
        return None
    federation.stage_outputs(state)
    return state


def _model(spec):
    return torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def scaffold_reference(tiny_run):
    spec = _spec(tiny_run, "ref")
    _run_until(spec)
    return _model(spec)


def test_interrupted_scaffold_run_resumes_bit_identically(tiny_run, scaffold_reference):
    spec = _spec(tiny_run, "resumed")
    assert _run_until(spec, stop_after=3) is None
    _run_until(spec)
    got = _model(spec)
    assert all(torch.equal(got[k], scaffold_reference[k]) for k in scaffold_reference)


def _interrupted(tiny_run, name):
    spec = _spec(tiny_run, name)
    _run_until(spec, stop_after=3)
    return spec, Path(spec.run_dir) / "checkpoint" / "clients" / "00001" / "r000003.pt"


def test_missing_client_state_is_a_clear_error_not_a_silent_resume(tiny_run):
    spec, state_file = _interrupted(tiny_run, "missing")
    state_file.unlink()
    with pytest.raises(RuntimeError, match=r"r000003\.pt: missing; the checkpoint of round 3 needs client 1") as err:
        _run_until(spec)  # before: "resuming from round 3", exit 0, different final weights
    assert type(err.value).__name__ == "ClientStateError" and "resume=restart" in str(err.value)


def test_replaced_client_state_is_detected_by_its_hash(tiny_run):
    spec, state_file = _interrupted(tiny_run, "replaced")
    other = state_file.parents[1] / "00002" / "r000003.pt"
    shutil.copyfile(other, state_file)  # a valid state, but another client's
    with pytest.raises(RuntimeError, match=r"r000003\.pt: sha256 .* differs .* recorded by the checkpoint of round 3"):
        _run_until(spec)


def test_corrupt_client_state_says_what_to_do(tiny_run, tmp_path):
    from fedmedbench.fl.state.client_state import ClientStateError, ClientStateStore

    spec, state_file = _interrupted(tiny_run, "corrupt")
    state_file.write_bytes(b"garbage")
    with pytest.raises(ClientStateError, match="resume=restart"):
        _run_until(spec)
    store = ClientStateStore(tmp_path)  # read directly (no manifest to compare with): the file is named, and the fix
    store.save(0, 1, {"c": torch.ones(2)})
    (tmp_path / "00000" / "r000001.pt").write_bytes(b"garbage")
    with pytest.raises(ClientStateError, match=r"r000001\.pt: cannot load client state .* resume=restart"):
        store.load(0, before_round=2)


def test_a_run_killed_before_its_first_checkpoint_says_there_was_none(tiny_run):
    from fedmedbench.fl.engine import federation as fed

    spec = fed.resolve_data_shapes(_spec(tiny_run, "early_kill", method="fedavg", rounds=2))
    folder = checkpoint.checkpoint_dir(spec.run_dir)
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("")  # what a job killed inside round 1 leaves
    said: list[str] = []
    assert fed.Federation(spec, log=said.append).initial_state().round == 0
    assert any("no checkpoint in" in m and "before its first round" in m for m in said), said
    assert not any("other settings" in m for m in said)
    checkpoint.save(spec.run_dir, checkpoint.RunState(round=1, arrays={}), "another-hash")
    said.clear()
    fed.Federation(spec, log=said.append).initial_state()
    assert any("written under other settings" in m for m in said), said


def test_resume_restart_starts_again_and_matches_an_uninterrupted_run(tiny_run, scaffold_reference):
    spec, state_file = _interrupted(tiny_run, "restart")
    state_file.unlink()
    spec.resume = "restart"
    _run_until(spec)
    got = _model(spec)
    assert all(torch.equal(got[k], scaffold_reference[k]) for k in scaffold_reference)
    with pytest.raises(ValueError, match="resume = 'sometimes'"):
        checkpoint.prepare(spec.run_dir, "sometimes")


def test_model_pt_bytes_are_identical_across_identical_runs(tiny_run):
    import hashlib

    from fedmedbench.fl.engine import flower as engine

    digests = []
    for name in ("same-a", "same-b"):
        spec = _spec(tiny_run, name, method="fedavg", rounds=1)
        engine.run(spec, log=lambda m: None)
        digests.append(hashlib.sha256((Path(spec.run_dir) / "model.pt").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_finished_run_keeps_results_not_resume_state(tiny_run):
    from fedmedbench.fl.engine import flower as engine

    spec = _spec(tiny_run, "finished", rounds=2)
    engine.run(spec, log=lambda m: None)
    run = Path(spec.run_dir)
    assert (run / "checkpoint" / "clients").is_dir()  # SCAFFOLD keeps a control variate per client while running
    engine.complete(spec, log=lambda m: None)
    assert not (run / "checkpoint").exists()
    left = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    assert left <= 2 * (run / "model.pt").stat().st_size
    assert sorted(p.name for p in run.iterdir()) == ["client_metrics.csv", "metrics.csv", "model.pt", "summary.json"]

    kept = _spec(tiny_run, "kept", rounds=2, keep_checkpoints=True)
    engine.run(kept, log=lambda m: None)
    engine.complete(kept, log=lambda m: None)
    assert (Path(kept.run_dir) / "checkpoint" / "server.pt").is_file()


def test_disk_full_names_the_folder_and_leaves_no_temp_file(tmp_path, monkeypatch):
    state = checkpoint.RunState(round=1, arrays=model_arrays(torch.nn.Linear(2, 2)))
    rows_log = checkpoint.RowsLog(tmp_path)  # the run's log: the second checkpoint appends to its rows files
    checkpoint.save(tmp_path, state, "h", rows_log=rows_log)
    _fill_disk_while_writing_states(monkeypatch)
    with pytest.raises(OSError, match=rf"No space left on {tmp_path / 'checkpoint'} while writing the server checkpoint"):
        checkpoint.save(tmp_path, checkpoint.RunState(round=2, arrays=state.arrays), "h", rows_log=rows_log)
    monkeypatch.undo()
    assert checkpoint.load(tmp_path, "h").round == 1
    assert leftovers(tmp_path / "checkpoint") == ["client_rows.jsonl", "rows.jsonl", "server.pt"]


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


FULL_DISK_WRITES = [
    ("npz", "d.npz", lambda p: io.write_npz(p, {"x": np.zeros(3)})),
    ("table", "t.csv", lambda p: io.write_csv(p, __import__("pandas").DataFrame({"a": [1]}))),
    ("markdown", "t.md", lambda p: io.write_text(p, "| a |")),
    ("json", "s.json", lambda p: io.write_json(p, {"a": 1})),
]


@pytest.mark.parametrize("name,file,write", FULL_DISK_WRITES, ids=[c[0] for c in FULL_DISK_WRITES])
def test_full_disk_in_any_file_write_names_the_folder(tmp_path, monkeypatch, name, file, write):
    """The disk fills when the data are flushed (as delayed allocation reports it): every writer of the
    pipeline goes through io.atomic_path, which names the folder and removes its temp file."""
    out = tmp_path / "results" / "tables"
    out.mkdir(parents=True)
    monkeypatch.setattr(os, "fsync", _no_space)
    with pytest.raises(OSError, match=rf"No space left on {re.escape(str(out))} while writing the file {re.escape(file)}"):
        write(out / file)
    assert leftovers(out) == []


def test_full_disk_in_a_figure_names_the_folder(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    monkeypatch.setattr(type(fig), "savefig", _no_space)
    with pytest.raises(OSError, match=rf"No space left on {re.escape(str(tmp_path))} while writing the file f\.png"):
        io.save_figure(tmp_path / "f.png", fig)
    plt.close(fig)
    assert leftovers(tmp_path) == []


def test_full_disk_in_an_output_folder_names_the_folder_not_its_temp(tmp_path):
    """Surgical exports write many files inside one atomic folder (OpenCV, YAML, JSON writers)."""
    from fedmedbench.data.surgical.fsutil import atomic_dir, write_png

    target = tmp_path / "exports" / "yolo"
    with pytest.raises(OSError, match=rf"No space left on {re.escape(str(target.parent))} while writing the folder yolo:"):
        with atomic_dir(target) as tmp:
            write_png(tmp / "a.png", np.zeros((4, 4), np.uint8))
            _no_space()
    assert leftovers(target.parent) == []


def test_a_run_another_process_trains_is_refused_naming_it(tmp_path):
    """After ``snakemake --unlock`` a second snakemake would train a run the first still trains: the run's own lock
    refuses it, naming the holder; a killed holder never blocks the rerun (the kernel drops its lock)."""
    import socket
    import subprocess
    import sys

    from fedmedbench.workflow.runlock import LOCK_NAME, RunLockedError, run_lock

    run_dir = tmp_path / "results" / "s" / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom fedmedbench.workflow.runlock import run_lock\n"
         "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n", str(run_dir)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"{re.escape(str(run_dir))}: this run is being trained by PID "
                                                 rf"{holder.pid} on host {re.escape(socket.gethostname())}"):
            with run_lock(run_dir):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert (run_dir / LOCK_NAME).exists()  # a SIGKILL leaves the file, not the lock
    with run_lock(run_dir):
        assert str(os.getpid()) in (run_dir / LOCK_NAME).read_text()
    assert not (run_dir / LOCK_NAME).exists()


def test_every_training_entry_holds_the_run_lock():
    for name in ("train_federated", "ultraflwr_train", "fedst_train"):
        text = (ROOT / "scripts" / f"{name}.py").read_text()
        assert text.index("with run_lock(spec.run_dir, log=snakemake.log[0])") < text.index("engine.run("), name


def test_temp_files_of_a_killed_job_are_removed_at_job_start(tmp_path):
    (tmp_path / "checkpoint" / "clients" / "00000").mkdir(parents=True)
    orphans = [tmp_path / ".model.pt.k2j3.tmp.pt", tmp_path / "checkpoint" / "clients" / "00000" / ".r000002.pt.x.tmp.pt"]
    for p in orphans:
        p.write_bytes(b"half")
    (tmp_path / "metrics.csv").write_text("round\n1\n")
    checkpoint.prepare(tmp_path)
    assert not any(p.exists() for p in orphans) and (tmp_path / "metrics.csv").is_file()


# ---------------------------------------------------------------- deployment: insecure settings are refused

SECURE_LINK = ["--ssl-ca-certfile", "ca.crt", "--ssl-certfile", "server.pem", "--ssl-keyfile", "server.key",
               "--enable-supernode-auth"]
INSECURE_STARTS = [
    ("superlink", ["--insecure"], ["--insecure turns TLS off", "no --enable-supernode-auth"]),
    ("superlink", ["--insecure", "--enable-supernode-auth"], ["--insecure turns TLS off"]),
    ("superlink", ["--ssl-certfile", "s.pem", "--ssl-keyfile", "s.key"], ["no --enable-supernode-auth"]),
    ("superlink", ["--enable-supernode-auth"], ["no --ssl-certfile/--ssl-keyfile"]),
    ("supernode", ["--insecure", "--superlink", "h:9092"], ["--insecure turns TLS off",
                                                            "no --auth-supernode-private-key"]),
]


@pytest.mark.parametrize("role,args,needles", INSECURE_STARTS)
def test_insecure_superlink_or_supernode_is_refused_unless_asked_loudly(role, args, needles, capsys):
    from fedmedbench.deploy import __main__ as deploy_cli
    from fedmedbench.deploy import launch

    with pytest.raises(SystemExit) as stop:
        deploy_cli.main([role, *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"refusing to start flower-{role} insecurely" in err and "Traceback" not in err
    for needle in needles:
        assert needle in err
    started = []
    launch.run(role, [*args, launch.FLAG], execute=lambda program, cmd: started.append(cmd))
    assert started == [[f"flower-{role}", *args]]  # the testing flag is the project's, not Flower's
    assert f"INSECURE flower-{role} ({launch.FLAG}): for tests only" in capsys.readouterr().err


def test_secure_superlink_and_supernode_start_without_a_warning(capsys):
    from fedmedbench.deploy import launch

    started = []
    launch.run("superlink", SECURE_LINK, execute=lambda program, cmd: started.append(cmd))
    launch.run("supernode", ["--root-certificates", "ca.crt", "--auth-supernode-private-key", "site01"],
               execute=lambda program, cmd: started.append(cmd))
    assert started[0] == ["flower-superlink", *SECURE_LINK] and started[1][0] == "flower-supernode"
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- runtime settings are not result params


def _workflow_params(tmp_path, cfg: dict, tag: str) -> dict:
    """Parse the workflow with ``cfg`` (no job runs) and return every rule's params for the config's runs."""
    from snakemake.api import SnakemakeApi
    try:
        from snakemake.io import Wildcards
    except ImportError:  # snakemake 9.17 keeps it in snakemake.io.container, 9.27 in snakemake.iocontainers
        try:
            from snakemake.io.container import Wildcards
        except ImportError:
            from snakemake.iocontainers import Wildcards
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    path = tmp_path / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with SnakemakeApi(OutputSettings()) as api:
        wf = api.workflow(resource_settings=ResourceSettings(), config_settings=ConfigSettings(configfiles=[path]),
                          snakefile=ROOT / "Snakefile", workdir=ROOT)._workflow
        g = wf.globals
        runs = [r for study in g["config"]["studies"] for r in g["runs"](study)]
        return {
            "download": dict(wf.get_rule("download_medmnist").params.items()),
            "train": [g["run_spec"](r) for r in runs],
            "ultraflwr": [g["ultraflwr_spec"](Wildcards(fromdict={"ugroup": "g", "usetting": "s", "strategy": "FedAvg",
                                                                   "seedset": "0"}))],
        }


def test_threads_log_every_and_download_settings_rerun_nothing(tmp_path):
    """They are read by the job's script, not carried in params (params changes rerun jobs and delete outputs)."""
    a = copy.deepcopy(MICRO)
    b = copy.deepcopy(MICRO)
    b["threads"] = {"train": 2}
    b["studies"]["micro"]["log_every"] = 7
    b["data"]["download"] = {"retries": 9, "timeout_s": 5}
    b["data"]["medmnist_root"] = "/elsewhere"
    b["keep_checkpoints"] = True
    b["resume"] = "restart"
    b["engine"] = {"backend": "ray", "cache_on_device": False, "deterministic": True,
                   "loader_workers": 4, "image_cache": "/elsewhere/frames"}
    pa, pb = _workflow_params(tmp_path, a, "a"), _workflow_params(tmp_path, b, "b")
    assert pa == pb
    assert pa["download"] == {} and all("threads" not in s and "log_every" not in s for s in pa["train"] + pa["ultraflwr"])


# ---------------------------------------------------------------- hostile replies: checked before they are averaged

#: (case, round-1 edit of client 1's reply, what the refusal says); the server knows every client's size (30)
REPLY_CASES = [
    ("bias of the wrong shape", lambda r: r.arrays.update({"features.0.bias": torch.zeros(1)}),
     r"model arrays 'features.0.bias' has shape \(1,\), the server's model \(16,\)"),
    ("missing key", lambda r: r.arrays.pop("classifier.2.bias"), r"model arrays lack 'classifier.2.bias'"),
    ("transposed weight", lambda r: r.arrays.update({"classifier.2.weight": r.arrays["classifier.2.weight"].T.clone()}),
     r"'classifier.2.weight' has shape \(128, 2\), the server's model \(2, 128\)"),
    ("oversized array", lambda r: r.arrays.update({"features.0.bias": torch.zeros(10**6)}),
     r"'features.0.bias' has shape \(1000000,\), the server's model \(16,\)"),
    ("non-finite value", lambda r: r.arrays["classifier.0.weight"].__setitem__((3, 5), float("inf")),
     r"model arrays 'classifier.0.weight' holds NaN or inf"),
    ("wrong dtype", lambda r: r.arrays.update({"features.0.weight": r.arrays["features.0.weight"].double()}),
     r"'features.0.weight' has dtype float64, the server's model float32"),
    ("num-examples 0", lambda r: setattr(r, "num_examples", 0), r"num-examples = 0, but the client trains on 30"),
    ("num-examples 10^12", lambda r: setattr(r, "num_examples", 10**12),
     r"num-examples = 1000000000000, but the client trains on 30"),
    ("num-examples -60", lambda r: setattr(r, "num_examples", -60), r"num-examples = -60, but the client trains on 30"),
    ("num-examples not whole", lambda r: setattr(r, "num_examples", 29.5), r"num-examples = 29.5 is not a whole number"),
]


def _hostile(monkeypatch, edit, pid: int = 1, rnd: int = 1) -> None:
    """Client ``pid`` edits its reply of round ``rnd`` before sending it (through the real ClientApp)."""
    from fedmedbench.fl.engine import federation as fed

    honest = fed.client_train

    def client_train(job, p, r, *args, **kw):
        result = honest(job, p, r, *args, **kw)
        if (p, r) == (pid, rnd):
            edit(result)
        return result

    monkeypatch.setattr(fed, "client_train", client_train)


@pytest.mark.parametrize("name,edit,needle", REPLY_CASES, ids=[c[0] for c in REPLY_CASES])
def test_a_bad_reply_is_refused_naming_the_client_and_key(tiny_run, monkeypatch, name, edit, needle):
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.engine.replies import ReplyError

    spec = _spec(tiny_run, f"hostile-{name}", method="fedavg", rounds=2)
    _hostile(monkeypatch, edit)
    with pytest.raises(ReplyError, match=r"round 1: client 1 sent a reply the server refuses: .*" + needle):
        engine.run(spec, log=lambda m: None)
    assert not (Path(spec.run_dir) / "model.pt").exists()
    assert not (Path(spec.run_dir) / "checkpoint" / "server.pt").exists()  # nothing of the round was kept


def test_a_reply_whose_num_examples_is_a_list_is_refused_naming_the_client(tiny_run, monkeypatch):
    """A metric record may hold a list: client 1's ClientApp sends ``num-examples = [30]`` (the project's own client
    writes numbers only, so the record is edited as it is built). The server refused it with a bare TypeError."""
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.engine.replies import ReplyError

    honest_record = engine._metrics_record

    def record(metrics):
        sent = metrics.get("num-examples")
        if not isinstance(sent, list):
            return honest_record(metrics)
        out = honest_record({**metrics, "num-examples": 0})
        out["num-examples"] = sent
        return out

    monkeypatch.setattr(engine, "_metrics_record", record)
    _hostile(monkeypatch, lambda r: setattr(r, "num_examples", [30]))
    spec = _spec(tiny_run, "hostile-list-size", method="fedavg", rounds=2)
    with pytest.raises(ReplyError, match=r"^round 1: client 1 sent a reply the server refuses: num-examples = \[30\] "
                                         r"is not a number$"):
        engine.run(spec, log=lambda m: None)
    assert not (Path(spec.run_dir) / "model.pt").exists()


def test_a_nan_reply_in_the_last_round_stops_the_run_and_saves_no_model(tiny_run, monkeypatch):
    """Round 2 of 2: client 2 sends NaN weights; the run stops naming the round and client 2, writes no model.pt,
    and the honest clients are not blamed."""
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.engine.replies import ReplyError

    spec = _spec(tiny_run, "nan-last", method="fedavg", rounds=2)
    _hostile(monkeypatch, lambda r: r.arrays["classifier.2.weight"].fill_(float("nan")), pid=2, rnd=2)
    with pytest.raises(ReplyError) as info:
        engine.run(spec, log=lambda m: None)
    text = str(info.value)
    assert text.startswith("round 2: client 2 sent") and "'classifier.2.weight' holds NaN or inf" in text
    assert "client 0" not in text and "client 1" not in text and "lr" not in text
    assert not (Path(spec.run_dir) / "model.pt").exists() and not (Path(spec.run_dir) / "summary.json").exists()


def test_a_non_finite_global_model_names_the_round_and_the_clients_to_blame():
    """After aggregation: a NaN model stops the run naming the round and the clients whose replies were
    non-finite (as under on_nonfinite: continue, where replies are not refused), or the server step."""
    from types import SimpleNamespace

    from fedmedbench.fl.engine.replies import NonFiniteModelError, check_global

    good = SimpleNamespace(arrays={"w": torch.ones(3)}, extras={})
    bad = SimpleNamespace(arrays={"w": torch.tensor([1, float("nan"), 1])}, extras={})
    nan_model = {"w": torch.tensor([1.0, float("nan"), 1.0]), "n": torch.tensor(3)}
    with pytest.raises(NonFiniteModelError, match=r"round 7: .*'w' holds NaN or inf.*client\(s\) \[2\]"):
        check_global(7, nan_model, {0: good, 1: good, 2: bad}, "fedavg")
    with pytest.raises(NonFiniteModelError, match=r"round 3: .*every client's reply was finite: method 'gpaf'"):
        check_global(3, nan_model, {0: good, 1: good}, "gpaf")
    check_global(3, {"w": torch.ones(3), "n": torch.tensor(3)}, {0: good}, "fedavg")


def test_a_server_step_that_makes_the_model_non_finite_stops_the_run(tiny_run, monkeypatch):
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.engine.replies import NonFiniteModelError
    from fedmedbench.fl.methods.fedavg import FedAvg

    honest = FedAvg.aggregate

    def broken(self, ctx):
        out = honest(self, ctx)
        if ctx.rnd == 2:
            out["classifier.2.bias"] = out["classifier.2.bias"] * np.nan
        return out

    monkeypatch.setattr(FedAvg, "aggregate", broken)
    spec = _spec(tiny_run, "nan-server", method="fedavg", rounds=2)
    with pytest.raises(NonFiniteModelError, match=r"round 2: the global model is not finite \('classifier.2.bias'"):
        engine.run(spec, log=lambda m: None)
    assert not (Path(spec.run_dir) / "model.pt").exists()


def test_where_the_server_does_not_know_a_size_num_examples_is_bounded():
    """Deployment where the server has no size for a site: a whole number in 1..MAX_EXAMPLES."""
    from fedmedbench.fl.engine.replies import MAX_EXAMPLES, ReplyCheck, ReplyError

    check = ReplyCheck(4, {"arrays": ["w"]}, {"w": ((2,), "float32")}, sizes=None)
    arrays = {"w": torch.zeros(2)}
    for n in (1, 240, MAX_EXAMPLES):
        check.check(3, arrays, n)
    for n, needle in [(0, "outside"), (-60, "outside"), (10**12, "outside"), (float("nan"), "not a whole number"),
                      (float("inf"), "not a whole number"), ("30", "not a number")]:
        with pytest.raises(ReplyError, match=rf"round 4: client 3 .*num-examples = .*{needle}"):
            check.check(3, arrays, n)


def test_a_non_numeric_num_examples_reaches_the_reply_check():
    """What the server reads from a reply's metrics is kept as it came unless it is a number, so the reply check
    refuses it naming the client (``float([30])`` was a bare TypeError before any check)."""
    from fedmedbench.fl.engine.replies import ReplyCheck, ReplyError, examples_value

    assert [examples_value(v) for v in (30, 30.0, np.int64(30), 29.5)] == [30, 30, 30, 29.5]
    assert type(examples_value(np.float32(30.0))) is int
    check = ReplyCheck(2, {"arrays": ["w"]}, {"w": ((2,), "float32")}, sizes={5: 30})
    check.check(5, {"w": torch.zeros(2)}, examples_value(np.int64(30)))
    for value, shown in [([30], r"\[30\]"), ([30.0, 1.0], r"\[30\.0, 1\.0\]"), ("30", "'30'"), (None, "None"),
                         (True, "True")]:
        n = examples_value(value)
        with pytest.raises(ReplyError, match=rf"^round 2: client 5 sent a reply the server refuses: num-examples = "
                                             rf"{shown} is not a number$"):
            check.check(5, {"w": torch.zeros(2)}, n)


def test_tensor_replies_are_checked_record_by_record():
    """Shapes, dtypes, undeclared keys and records, and NaN in an extra record, on tensors as fl/ holds them."""
    from fedmedbench.fl.engine.replies import ReplyCheck, ReplyError

    check = ReplyCheck(1, {"arrays": ["w", "n"], "delta_c": ["w"]}, {"w": ((2, 3), "float32"), "n": ((), "int64")},
                       sizes={0: 5})
    for kind in (torch.as_tensor,):
        ok = {"w": kind(np.zeros((2, 3), np.float32)), "n": kind(np.array(4, np.int64))}
        check.check(0, ok, 5, {"delta_c": {"w": kind(np.zeros((2, 3), np.float32))}})
        check.check(0, ok, 5, {})  # an extra record may be absent
        for arrays, extras, needle in [
            ({**ok, "w": kind(np.zeros((3, 2), np.float32))}, {}, r"'w' has shape \(3, 2\)"),
            ({**ok, "n": kind(np.array(4, np.int32))}, {}, "'n' has dtype int32"),
            ({**ok, "x": kind(np.zeros(1, np.float32))}, {}, "'x', which this method does not send"),
            (ok, {"delta_c": {"w": kind(np.full((2, 3), np.nan, np.float32))}}, "record 'delta_c' 'w' holds NaN"),
            (ok, {"delta_c": {}}, None),
            (ok, {"queries": {"w": kind(np.zeros((2, 3), np.float32))}}, "undeclared record 'queries'"),
        ]:
            if needle is None:
                check.check(0, arrays, 5, extras)
                continue
            with pytest.raises(ReplyError, match=needle):
                check.check(0, arrays, 5, extras)


def test_a_deployed_sites_bad_reply_is_refused_naming_the_site(tiny_run, tmp_path, monkeypatch):
    """The deployed ServerApp (every message serialised as over the network) refuses a site's reply of the
    wrong shape and a made-up size alike, naming the site, before averaging anything."""
    from helpers.deploy_inline import run_inline

    from fedmedbench.deploy.export import server_spec
    from fedmedbench.deploy.site_data import export_sites
    from fedmedbench.fl.engine.replies import ReplyError
    from fedmedbench.fl.spec import RunSpec

    spec = _spec(tiny_run, "deploy-src", method="fedavg", rounds=1)
    export_sites(spec, tmp_path / "sites", {"dataset": "breastmnist"})
    for case in (0, 7):  # the bias of the wrong shape, num-examples 10^12
        _, edit, needle = REPLY_CASES[case]
        deployed = RunSpec.from_dict({**server_spec(spec), "run_dir": str(tmp_path / f"deployed-{case}")})
        _hostile(monkeypatch, edit, pid=2)
        with pytest.raises(ReplyError, match=r"round 1: client 2 sent a reply the server refuses: .*" + needle):
            run_inline(deployed, tmp_path / "sites", tmp_path / "states", 3)
        assert not (Path(deployed.run_dir) / "model.pt").exists()
        monkeypatch.undo()


def test_a_reply_without_its_arrays_or_size_is_refused_naming_the_client():
    from flwr.app import ArrayRecord, MetricRecord, RecordDict

    from fedmedbench.fl.engine import flower as engine

    allowed = engine.AllowedContent(["w"], ())
    allowed.check(RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord({"num-examples": 3.0})}), 4)
    for content in (RecordDict({"metrics": MetricRecord({"num-examples": 3.0})}),
                    RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord({"train_loss": 1.0})})):
        with pytest.raises(engine.ClientFailure, match=r"client 4 sent a reply without its 'arrays' record or its "
                                                       r"'num-examples' metric"):
            allowed.check(content, 4)


def test_under_on_nonfinite_continue_a_nan_reply_is_averaged_as_the_reference_does(tiny_run, monkeypatch):
    """The early-stopping reference trains on through NaN: there the finiteness checks are off (the key, shape,
    dtype and size checks stay), and the run completes with the NaN model the reference would have."""
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.engine.replies import ReplyError

    spec = _spec(tiny_run, "nan-continue", method="fedavg", rounds=1)
    spec = dataclasses.replace(spec, train={**spec.train, "on_nonfinite": "continue"})
    _hostile(monkeypatch, lambda r: r.arrays["classifier.2.bias"].fill_(float("nan")))
    engine.run(spec, log=lambda m: None)
    assert torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)["classifier.2.bias"].isnan().all()
    monkeypatch.undo()
    spec = dataclasses.replace(spec, run_dir=str(tiny_run / "shape-continue"))
    _hostile(monkeypatch, REPLY_CASES[0][1])
    with pytest.raises(ReplyError, match="'features.0.bias' has shape"):
        engine.run(spec, log=lambda m: None)


def test_checking_replies_leaves_the_runs_random_draws_alone(tiny_run):
    """The model replies are checked against is built mid-run: torch's global generator is left as it was."""
    from fedmedbench.fl.engine import federation as fed

    spec = fed.resolve_data_shapes(_spec(tiny_run, "rng", method="fedavg", rounds=1))
    f = fed.Federation(spec, log=lambda m: None)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    f.check_replies(1, {})
    assert torch.equal(before, torch.get_rng_state())
