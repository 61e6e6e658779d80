"""Inputs changed after the workflow built or imported them are refused where training reads them, naming the file:
an edited partition, a partition of other data, a swapped copy of a user dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import split_labels

from fedmedbench.data import synthetic
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A folder with a small synthetic BreastMNIST (b.npz) and a 3-client partition built from it (p.json)."""
    d = tmp_path_factory.mktemp("built")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 240, "val": 30, "test": 60})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "iid", 3, 0, {}, num_classes=2))
    return d


def _federated_data(path: Path, npz: Path):
    from fedmedbench.fl.data import FederatedData, load_partition

    load_partition.cache_clear()
    return FederatedData(path, {"base": str(npz)})


def _moved(doc: dict, n: int = 20) -> dict:
    """``doc`` with ``n`` training indices moved from client 0 to client 1 (a valid partition, other clients' data)."""
    moved = doc["clients"][0]["train"][:n]
    doc["clients"][0]["train"] = doc["clients"][0]["train"][n:]
    doc["clients"][1]["train"] = sorted(doc["clients"][1]["train"] + moved)
    return doc


def test_a_partition_records_its_content_and_its_data(built):
    doc = json.loads((built / "p.json").read_text())
    assert doc[P.DIGEST_KEY] == P.content_digest(doc)
    labels = np.concatenate([np.load(built / "b.npz")[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")])
    assert doc[P.LABELS_KEY] == P.labels_digest(labels)
    data = _federated_data(built / "p.json", built / "b.npz")
    assert sum(len(data.client(i).train_y) for i in range(3)) == 240  # the file as built loads


@pytest.mark.parametrize("edit", [
    _moved,
    lambda d: d.__setitem__("seed", 1),  # what built it, edited
    lambda d: d["global_test"][0]["idx"].pop(),
], ids=["20 indices moved to another client", "seed", "global test set"])
def test_an_edited_partition_is_refused_naming_the_file(built, tmp_path, edit):
    doc = json.loads((built / "p.json").read_text())
    path = tmp_path / "seed0.json"
    edit(doc)
    io.write_json(path, doc)
    with pytest.raises(P.PartitionError) as err:
        _federated_data(path, built / "b.npz")
    message = str(err.value)
    assert message.startswith(f"{path}: the partition no longer matches the 'sha256' recorded when it was built")
    assert "delete it and run snakemake again" in message and "\n" not in message


def test_a_partition_without_its_digest_is_refused(built, tmp_path):
    doc = json.loads((built / "p.json").read_text())
    del doc[P.DIGEST_KEY]
    io.write_json(path := tmp_path / "old.json", doc)
    with pytest.raises(P.PartitionError, match=rf"^{path}: the partition records no 'sha256' of its content"):
        _federated_data(path, built / "b.npz")


def test_a_partition_of_other_data_is_refused_naming_both_files(built, tmp_path):
    """Same sizes, other labels: every index is in range, but the partition was drawn from another file."""
    arrays = dict(np.load(built / "b.npz"))
    arrays["train_labels"] = 1 - arrays["train_labels"]
    io.write_npz(other := tmp_path / "other.npz", arrays)
    data = _federated_data(built / "p.json", other)
    with pytest.raises(P.PartitionError, match=rf"^{built / 'p.json'}: drawn from other data than {other} "
                                               r"\(source 'base': its labels differ"):
        data.client(0)


def test_a_run_on_an_edited_partition_trains_nothing(built, tmp_path):
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.spec import RunSpec

    path = tmp_path / "seed0.json"
    io.write_json(path, _moved(json.loads((built / "p.json").read_text())))
    run = tmp_path / "run"
    spec = RunSpec(run_dir=str(run), study="t", dataset="breastmnist", setting="iid", method="fedavg", seed=0,
                   partition_path=str(path), sources={"base": str(built / "b.npz")}, image_size=28,
                   train={"rounds": 1, "local_epochs": 1, "batch_size": 32, "lr": 0.05}, device="cpu", threads=1,
                   model="cnn_small")
    from fedmedbench.fl.data import load_partition

    load_partition.cache_clear()
    with pytest.raises(P.PartitionError, match=rf"^{path}: the partition no longer matches"):
        engine.run(spec, log=lambda m: None)
    assert not any((run / name).exists() for name in ("model.pt", "metrics.csv", "summary.json"))


# ---------------------------------------------------------------- a user dataset's imported copy


def _user_npz(path: Path, seed: int) -> Path:
    """A valid MedMNIST-layout file of 3 classes, 1 channel, 28 px (``seed`` draws its pixels and labels)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", 60), ("val", 12), ("test", 12)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % 3).reshape(-1, 1).astype(np.uint8)
        rng.shuffle(arrays[f"{split}_labels"])
    np.savez(path, **arrays)
    return path


USER_ENTRY = {"path": "mine.npz", "labels": ["a", "b", "c"], "task": "multi-class", "channels": 1, "sizes": [28]}


def test_a_swapped_user_copy_is_refused_where_it_is_read(tmp_path):
    from fedmedbench.data import medmnist, user
    from fedmedbench.fl.data import load_pool

    source = _user_npz(tmp_path / "mine.npz", seed=0)
    copy = tmp_path / "resources" / "user" / "mine_28.npz"
    user.import_file({**USER_ENTRY, "path": str(source)}, 28, copy)
    record = json.loads((tmp_path / "resources" / "user" / "mine_28.import.json").read_text())
    assert record == {"file": "mine_28.npz", "sha256": io.file_digest(source), "source": str(source.resolve())}
    assert medmnist.load_npz(copy)["train_labels"].shape == (60,)  # the copy as imported loads
    _user_npz(copy, seed=1)  # another valid file in its place
    with pytest.raises(medmnist.DataError) as err:
        medmnist.load_npz(copy)
    message = str(err.value)
    assert message.startswith(f"{copy}: SHA-256 {io.file_digest(copy)} differs from the {record['sha256']} recorded "
                              "when it was imported") and "\n" not in message
    assert f"import {source.resolve()} again" in message
    load_pool.cache_clear()
    with pytest.raises(medmnist.DataError, match=rf"^{copy}: SHA-256"):
        load_pool(str(copy))  # what training reads


@pytest.mark.slow
def test_snakemake_refuses_a_swapped_user_copy_in_one_line(tmp_path):
    """Imported, then overwritten with another valid file: the partition job (the first to read it) stops naming it."""
    import os
    import subprocess
    import sys

    import yaml
    from helpers import copy_workflow

    work = copy_workflow(tmp_path / "wf")
    _user_npz(work / "mine.npz", seed=0)
    cfg = {"data": {"origin": "real"}, "device": "cpu", "datasets": {"mine": USER_ENTRY},
           "studies": {"s": {"datasets": ["mine"], "seeds": [0], "methods": ["fedavg"],
                             "settings": {"iid": {"scheme": "iid", "num_clients": 2}}}}}
    (work / "mine.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "FEDMEDBENCH_DEBUG"}

    def snakemake(target: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", target, "--configfile", "mine.yaml"],
                              cwd=work, capture_output=True, text=True, timeout=300, env=env)

    assert snakemake("resources/user/mine_28.npz").returncode == 0
    _user_npz(work / "resources" / "user" / "mine_28.npz", seed=1)
    proc = snakemake("resources/partitions/s/mine/iid/seed0.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    lines = [line for line in out.splitlines() if "differs from the" in line]
    assert len(lines) == 1 and lines[0].startswith("error: resources/user/mine_28.npz: SHA-256 "), out
    assert not (work / "resources" / "partitions" / "s" / "mine" / "iid" / "seed0.json").exists()
