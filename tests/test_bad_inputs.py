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
from fedmedbench.fl.api import ClientContext, ClientData, TrainConfig
from fedmedbench.fl.arrays import model_arrays
from fedmedbench.fl.methods._sgd import StepHooks, local_loop
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


def _fill_disk_while_writing_states(monkeypatch) -> None:
    """State files (server.pt, client states) get half their bytes written, then the disk is full."""
    from fedmedbench.fl import state_file

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
    for smk in ("train.smk", "partition.smk"):  # every reader of an official file depends on its marker
        assert "verified_marker(" in (ROOT / "rules" / smk).read_text()


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
    from fedmedbench.configcheck import ignored_settings

    warnings = ignored_settings({"data": {"origin": "synthetic", "medmnist_root": "/data/medmnist"}})
    assert len(warnings) == 1 and "data.medmnist_root" in warnings[0] and "ignored" in warnings[0]
    assert ignored_settings({"data": {"origin": "real", "medmnist_root": "/data/medmnist"}}) == []


# ---------------------------------------------------------------- config files (read strictly, file:line)


def test_duplicate_yaml_key_is_rejected_with_its_line(tmp_path):
    from fedmedbench.configcheck import ConfigFileError, check_file

    path = tmp_path / "dup.yaml"
    path.write_text("device: cpu\nstudies:\n  s:\n    seeds: [0]\n    seeds: [1]\n")
    with pytest.raises(ConfigFileError, match=r"dup\.yaml:5:5: duplicate key 'seeds' \(first defined at line 4\)"):
        check_file(path)


def test_invalid_yaml_names_file_and_line(tmp_path):
    from fedmedbench.configcheck import ConfigFileError, check_file

    path = tmp_path / "broken.yaml"
    path.write_text("device: cpu\nstudies:\n  x: [1\n  y: 2\n")
    with pytest.raises(ConfigFileError, match=r"broken\.yaml:4:\d+: "):
        check_file(path)


def test_exponent_floats_are_numbers_where_the_schema_wants_one(tmp_path):
    from fedmedbench.configcheck import check_file, coerce_numbers

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


def test_workflow_checks_its_config_files_strictly():
    snakefile = (ROOT / "Snakefile").read_text()
    assert snakefile.index("check_files(") < snakefile.index('configfile: "config/config.yaml"')
    assert "coerce_numbers(config" in (ROOT / "rules" / "common.smk").read_text()


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
    from fedmedbench.fl import federation as fed

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
    from fedmedbench.fl.client_state import ClientStateError, ClientStateStore

    spec, state_file = _interrupted(tiny_run, "corrupt")
    state_file.write_bytes(b"garbage")
    with pytest.raises(ClientStateError, match="resume=restart"):
        _run_until(spec)
    store = ClientStateStore(tmp_path)  # read directly (no manifest to compare with): the file is named, and the fix
    store.save(0, 1, {"c": torch.ones(2)})
    (tmp_path / "00000" / "r000001.pt").write_bytes(b"garbage")
    with pytest.raises(ClientStateError, match=r"r000001\.pt: cannot load client state .* resume=restart"):
        store.load(0, before_round=2)


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

    from fedmedbench.fl import engine

    digests = []
    for name in ("same-a", "same-b"):
        spec = _spec(tiny_run, name, method="fedavg", rounds=1)
        engine.run(spec, log=lambda m: None)
        digests.append(hashlib.sha256((Path(spec.run_dir) / "model.pt").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_finished_run_keeps_results_not_resume_state(tiny_run):
    from fedmedbench.fl import engine

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


def test_temp_files_of_a_killed_job_are_removed_at_job_start(tmp_path):
    (tmp_path / "checkpoint" / "clients" / "00000").mkdir(parents=True)
    orphans = [tmp_path / ".model.pt.k2j3.tmp.pt", tmp_path / "checkpoint" / "clients" / "00000" / ".r000002.pt.x.tmp.pt"]
    for p in orphans:
        p.write_bytes(b"half")
    (tmp_path / "metrics.csv").write_text("round\n1\n")
    checkpoint.prepare(tmp_path)
    assert not any(p.exists() for p in orphans) and (tmp_path / "metrics.csv").is_file()


# ---------------------------------------------------------------- runtime settings are not result params


def _workflow_params(tmp_path, cfg: dict, tag: str) -> dict:
    """Parse the workflow with ``cfg`` (no job runs) and return every rule's params for the config's runs."""
    from snakemake.api import SnakemakeApi
    try:
        from snakemake.io import Wildcards
    except ImportError:  # snakemake >= 9.17 keeps it in snakemake.io.container
        from snakemake.io.container import Wildcards
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
