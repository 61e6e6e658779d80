"""YOLO export (symlinks, label format, data.yaml, ID/CD test splits) and FedST clip export (history)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import surgical as F

from fedmedbench.data.surgical import recurate as R
from fedmedbench.data.surgical.export_clips import build_clips, export_sites
from fedmedbench.data.surgical.export_yolo import export_group, yolo_lines
from fedmedbench.data.surgical.group_io import write_group
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import parse_boxes, read_index

GROUP = {"datasets": ["cholectrack20"], "num_clients": 3, "seed": 0, "exclude_videos": {"cholectrack20": ["VID30", "VID31"]},
         "video_splits": {"cholectrack20": F.CT20_SPLITS},
         "settings": {"a": {"scheme": "iid"}, "c": {"scheme": "lmo", "base": "a", "client_classes": ["all", "energy", "cold"]}}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exp")
    cfg, _ = F.make(root / "raw", "cholectrack20")
    build_index("cholectrack20", cfg, root / "raw", root / "idx", log=lambda m: None)
    df, meta = read_index(root / "idx")
    group = R.build_group("g", {"cholectrack20": df}, {"cholectrack20": meta}, GROUP, F.TOOL_GROUPS)
    write_group(group, root / "group", "synthetic")
    manifests = export_group(root / "group", root / "yolo")
    return root, group, manifests


def _stems(folder: Path) -> set[str]:
    return {p.stem for p in folder.iterdir()}


def test_yolo_layout_symlinks_and_yaml(exported):
    root, group, manifests = exported
    cdir = root / "yolo" / "a" / "client_1"
    for split in ("train", "val", "test", "test_cd"):
        images = sorted((cdir / split / "images").iterdir())
        assert images and all(p.is_symlink() for p in images), split
        assert all(p.resolve().is_file() and "CholecTrack20" in str(p.resolve()) for p in images)
        assert _stems(cdir / split / "images") == _stems(cdir / split / "labels")
    doc = yaml.safe_load((cdir / "data.yaml").read_text())
    assert doc["path"] == str((root / "yolo" / "a" / "client_1").resolve())
    assert (doc["train"], doc["val"], doc["test"]) == ("train/images", "val/images", "test/images")
    assert doc["names"] == dict(enumerate(group.classes)) and doc["nc"] == len(group.classes)
    assert yaml.safe_load((cdir / "data_cd.yaml").read_text())["test"] == "test_cd/images"
    m = manifests["a"]
    assert m["clients"][1]["data_yaml"] == str(cdir.resolve() / "data.yaml")
    assert m["pooled"]["train"]["frames"] == sum(c["counts"]["train"]["frames"] for c in m["clients"])


def test_yolo_labels_round_trip_the_index_boxes(exported):
    root, group, _ = exported
    frames = group.settings["a"].frames
    labels = root / "yolo" / "a" / "client_0" / "train" / "labels"
    class_index = {c: i for i, c in enumerate(group.classes)}
    for row in frames[(frames["client"] == 0) & (frames["split"] == "train")].itertuples():
        stem = f"cholectrack20__{row.video_id}__{row.frame:07d}"
        lines = (labels / f"{stem}.txt").read_text().splitlines()
        boxes = parse_boxes(row.boxes)
        assert len(lines) == len(boxes)
        for line, b in zip(lines, boxes, strict=True):
            c, xc, yc, w, h = line.split()
            vals = np.array([float(xc), float(yc), float(w), float(h)])
            assert int(c) == class_index[b.cls] and (vals >= 0).all() and (vals <= 1).all()
            assert float(xc) * row.width == pytest.approx((b.x1 + b.x2) / 2, abs=1e-3)
            assert float(w) * row.width == pytest.approx(b.x2 - b.x1, abs=1e-3)
    assert yolo_lines("[]", 10, 10, class_index) == []


def test_cross_distribution_test_is_the_other_clients_tests(exported):
    root, group, _ = exported
    base = root / "yolo" / "a"
    tests = [_stems(base / f"client_{k}" / "test" / "images") for k in range(3)]
    for k in range(3):
        assert _stems(base / f"client_{k}" / "test_cd" / "images") == set().union(*(tests[j] for j in range(3) if j != k))
        assert not (tests[k] & _stems(base / f"client_{k}" / "train" / "images"))
    assert _stems(base / "pooled" / "test" / "images") == set().union(*tests)


def test_lmo_labels_only_allowed_classes(exported):
    root, group, _ = exported
    cold = {group.classes.index(c) for c in F.TOOL_GROUPS["cold"]}
    train_labels = root / "yolo" / "c" / "client_2" / "train" / "labels"
    ids = {int(line.split()[0]) for p in train_labels.iterdir() for line in p.read_text().splitlines()}
    assert ids and ids <= cold
    test_ids = {int(line.split()[0]) for p in (root / "yolo" / "c" / "client_2" / "test" / "labels").iterdir()
                for line in p.read_text().splitlines()}
    assert test_ids - cold  # evaluation labels stay complete


def test_ultralytics_reads_the_export(exported):
    """Ultralytics finds every label next to the (unresolved) symlinked image."""
    from ultralytics.data.utils import img2label_paths

    root, _, _ = exported
    images = sorted(str(p) for p in (root / "yolo" / "a" / "client_0" / "train" / "images").iterdir())
    assert all(Path(p).is_file() for p in img2label_paths(images))


# --- clips ------------------------------------------------------------------------------------------------------

def _index(times, labelled=None, split="train", video="v1"):
    labelled = labelled or [True] * len(times)
    return pd.DataFrame({"dataset": "d", "video_id": video, "frame": range(len(times)), "timestamp_s": times,
                         "image_path": [f"/f{i}.png" for i in range(len(times))], "width": 8, "height": 8,
                         "split": split, "labelled": labelled, "boxes": "", "mask_path": [f"/m{i}.png" for i in range(len(times))]})


def test_clip_history_at_interval_with_duplication():
    clips = build_clips(_index([0.0, 0.2, 0.4, 0.6, 0.8]), 3, 0.2, 0.1)
    assert clips.iloc[0]["clip_paths"] == ["/f0.png"] * 4 and clips.iloc[0]["n_duplicated"] == 3
    assert clips.iloc[1]["clip_paths"] == ["/f1.png", "/f1.png", "/f0.png", "/f1.png"]
    assert clips.iloc[4]["clip_paths"] == ["/f1.png", "/f2.png", "/f3.png", "/f4.png"]
    assert clips.iloc[4]["clip_offsets_s"] == pytest.approx([-0.6, -0.4, -0.2, 0.0])
    assert clips["mask_path"].tolist() == [f"/m{i}.png" for i in range(5)]


def test_clip_history_gaps_and_unlabelled_frames():
    # 2 Hz frames: nothing within 0.05 s of t-0.2, t-0.4, t-0.6, so history is duplicated ...
    assert build_clips(_index([0.0, 0.5, 1.0]), 3, 0.2, 0.05)["n_duplicated"].tolist() == [3, 3, 3]
    # ... while a frame within the tolerance of a target fills that slot (t=0.5: 0.0 is 0.1 s from t-0.6)
    assert build_clips(_index([0.0, 0.5]), 3, 0.2, 0.1).iloc[1]["clip_offsets_s"] == pytest.approx([-0.5, -0.5, 0, 0])
    # ... unlabelled frames give history but are never a clip themselves
    clips = build_clips(_index([0.0, 0.2, 0.4, 0.6], labelled=[False, False, False, True]), 3, 0.2, 0.1)
    assert len(clips) == 1 and clips.iloc[0]["clip_paths"] == ["/f0.png", "/f1.png", "/f2.png", "/f3.png"]


def test_clip_history_stays_in_its_video_and_split():
    df = pd.concat([_index([0.0, 0.2], video="a"), _index([0.4, 0.6], video="b"),
                    _index([0.8], split="test", video="a")], ignore_index=True)
    df["image_path"] = [f"/{v}{s}{i}.png" for i, (v, s) in enumerate(zip(df["video_id"], df["split"], strict=True))]
    clips = build_clips(df, 3, 0.2, 0.1).set_index(["split", "video_id", "frame"])
    assert clips.loc[("train", "b", 0), "n_duplicated"] == 3  # a's frame at 0.2 s is another video
    assert clips.loc[("test", "a", 0), "n_duplicated"] == 3  # train frames are another split


def test_clips_need_timestamps():
    with pytest.raises(ValueError, match="no timestamps"):
        build_clips(_index([math.nan, 1.0]), 3, 0.2, 0.1)


def test_export_sites_metadata(tmp_path):
    cfg, _ = F.make(tmp_path / "raw", "rarp")
    build_index("rarp", cfg, tmp_path / "raw", tmp_path / "idx", log=lambda m: None)
    sites = {"C": {"dataset": "rarp", "surgery_type": "prostatectomy", "role": "federated"}}
    summary = export_sites({"rarp": read_index(tmp_path / "idx")}, sites,
                           {"num_previous": 3, "interval_s": 0.2, "tolerance_s": 0.1}, tmp_path / "clips", "synthetic")
    info = json.loads((tmp_path / "clips" / "C" / "site.json").read_text())
    assert info["prompt"] == "This is the Local site C model and the surgery type is prostatectomy"
    assert info["classes"] == ["background", "shaft", "wrist", "clasper"] and info["role"] == "federated"
    clips = pd.read_parquet(tmp_path / "clips" / "C" / "clips.parquet")
    assert len(clips) == 9 and info["counts"]["train"]["clips"] == 6  # label_every 2 of 6 frames, 3 videos
    assert all(len(p) == 4 and p[-1].endswith(".png") for p in clips["clip_paths"])
    assert summary["sites"]["C"]["history_duplicated_fraction"] < 1.0
    with pytest.raises(ValueError, match="not a segmentation dataset"):
        export_sites({"x": ({}, {"task": "detection"})}, {"Z": {"dataset": "x", "surgery_type": "s"}},
                     {"num_previous": 3, "interval_s": 0.2, "tolerance_s": 0.1}, tmp_path / "c2", "synthetic")
    assert not (tmp_path / "c2").exists()


def test_export_sites_exclude_videos(tmp_path):
    """A site's exclude_videos leave those videos out of its clips (FedST site A: EndoVis2017 test 9, 10)."""
    cfg, _ = F.make(tmp_path / "raw", "endovis2017")
    build_index("endovis2017", cfg, tmp_path / "raw", tmp_path / "idx", log=lambda m: None)
    index = read_index(tmp_path / "idx")
    clip_cfg = {"num_previous": 3, "interval_s": 0.2, "tolerance_s": 0.1}
    sites = {"A": {"dataset": "endovis2017", "surgery_type": "nephrectomy", "exclude_videos": ["instrument_dataset_3"]}}
    export_sites({"endovis2017": index}, sites, clip_cfg, tmp_path / "clips", "synthetic")
    clips = pd.read_parquet(tmp_path / "clips" / "A" / "clips.parquet")
    info = json.loads((tmp_path / "clips" / "A" / "site.json").read_text())
    assert "instrument_dataset_3" in set(index[0]["video_id"])
    assert set(clips["video_id"]) == set(index[0]["video_id"]) - {"instrument_dataset_3"}
    assert not any("instrument_dataset_3" in p for ps in clips["clip_paths"] for p in ps)
    assert info["excluded_videos"] == ["instrument_dataset_3"]
    with pytest.raises(ValueError, match="not videos of dataset"):
        export_sites({"endovis2017": index}, {"A": {**sites["A"], "exclude_videos": ["nope"]}}, clip_cfg,
                     tmp_path / "c2", "synthetic")
