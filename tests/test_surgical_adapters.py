"""Every surgical adapter on fixtures in its real release layout, including the bad-file cases."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
from helpers import surgical as F

from fedmedbench.data.surgical.badfiles import BadFileError, DatasetNotFoundError
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import PART_CLASSES, TOOL_CLASSES, parse_boxes, read_index


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Each layout written once; tests that damage files work on a copy."""
    root = tmp_path_factory.mktemp("surgical_raw")
    return {name: F.make(root, name) for name in F.SPECS} | {"_root": root}


@pytest.fixture
def copy_of(pristine, tmp_path):
    def _copy(name):
        cfg, folder = pristine[name]
        dst = tmp_path / "raw" / folder.name
        shutil.copytree(folder, dst)
        return cfg, tmp_path / "raw", dst
    return _copy


def _index(name, cfg, root, out, policy="fail"):
    build_index(name, cfg, root, out, policy=policy, log=lambda m: None)
    return read_index(out)


def _bad_case(copy_of, tmp_path, name, damage, expect_in_reason):
    """Under 'fail' the error names the file and nothing is written; under 'skip-and-report'
    the frame is left out and listed with its reason."""
    cfg, root, folder = copy_of(name)
    path = damage(folder)
    out = tmp_path / "index"
    with pytest.raises(BadFileError) as err:
        _index(name, cfg, root, out)
    assert str(path) in str(err.value) and expect_in_reason in str(err.value)
    assert not out.exists()
    df, meta = _index(name, cfg, root, out, policy="skip-and-report")
    report = pd.read_csv(out / "bad_files.csv")
    hit = report[report["path"] == str(path)]
    assert len(hit) >= 1 and expect_in_reason in hit["reason"].iloc[0]
    assert meta["n_bad_files"] == len(report) and len(df) > 0
    return df, report


# --- missing data -----------------------------------------------------------------------------------

def test_missing_dataset_folder_names_dataset_and_place(tmp_path):
    cfg = {"layout": "cholectrack20", "folder": "CholecTrack20"}
    with pytest.raises(DatasetNotFoundError) as err:
        build_index("cholectrack20", cfg, tmp_path, tmp_path / "out", log=lambda m: None)
    msg = str(err.value)
    assert "'cholectrack20' not found" in msg and str(tmp_path / "CholecTrack20") in msg and "surgical_data.md" in msg
    with pytest.raises(DatasetNotFoundError, match="surgical.root is not set"):
        build_index("cholectrack20", cfg, None, tmp_path / "out", log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_wrong_layout_is_named(tmp_path):
    (tmp_path / "EndoVis2017").mkdir()
    with pytest.raises(DatasetNotFoundError, match="not the EndoVis2017 layout"):
        build_index("ev", {"layout": "endovis2017", "folder": "EndoVis2017"}, tmp_path, tmp_path / "o", log=lambda m: None)


# --- m2cai16 -----------------------------------------------------------------------------------------

def test_m2cai16_index(pristine, tmp_path):
    cfg, folder = pristine["m2cai16"]
    df, meta = _index("m2cai16", cfg, folder.parent, tmp_path / "idx")
    images = sorted(p.stem for p in (folder / "JPEGImages").glob("*.jpg"))
    assert len(df) == sum(not s.endswith("_flip") for s in images)  # augmentation copies left out
    assert not df["image_path"].str.contains("_flip").any()
    assert meta["fps"] == 25.0 and meta["fps_source"] == "official" and meta["classes"] == list(TOOL_CLASSES)
    assert np.allclose(df["timestamp_s"], df["frame"] / 25.0)
    assert set(df["split"]) <= {"train", "val", "test"} and df["video_id"].nunique() == 10
    row = df.iloc[0]
    xml = ET.parse(folder / "Annotations" / f"{Path(row.image_path).stem}.xml").getroot()
    names = sorted(o.findtext("name").lower().replace("specimenbag", "specimen_bag") for o in xml.iter("object"))
    assert sorted(b.cls for b in parse_boxes(row.boxes)) == names
    for r in df.itertuples():
        for b in parse_boxes(r.boxes):
            assert 0 <= b.x1 < b.x2 <= r.width and 0 <= b.y1 < b.y2 <= r.height


def _m2_first(folder, suffix):
    return sorted((folder / ("JPEGImages" if suffix == ".jpg" else "Annotations")).glob(f"v03_*[0-9]{suffix}"))[0]


def _edit_xml(path, fn):
    tree = ET.parse(path)
    fn(tree.getroot())
    tree.write(path)
    return path


@pytest.mark.parametrize("case,reason", [
    ("unreadable_image", "unreadable"),
    ("xml_parse", "does not parse"),
    ("box_outside", "outside"),
    ("unknown_label", "not in the class map"),
    ("size_mismatch", "differs from the image size"),
])
def test_m2cai16_bad_files(copy_of, tmp_path, case, reason):
    def damage(folder):
        if case == "unreadable_image":
            p = _m2_first(folder, ".jpg")
            F.garbage(p)
            return p
        xml = _m2_first(folder, ".xml")
        if case == "xml_parse":
            xml.write_text("<annotation><object>")
            return xml

        def box_out(root):
            obj = ET.SubElement(root, "object")
            ET.SubElement(obj, "name").text = "Grasper"
            bb = ET.SubElement(obj, "bndbox")
            for k, v in (("xmin", 10), ("ymin", 5), ("xmax", F.W + 40), ("ymax", 20)):
                ET.SubElement(bb, k).text = str(v)

        def unknown(root):
            obj = ET.SubElement(root, "object")
            ET.SubElement(obj, "name").text = "LaserScalpel"
            bb = ET.SubElement(obj, "bndbox")
            for k, v in (("xmin", 1), ("ymin", 1), ("xmax", 5), ("ymax", 5)):
                ET.SubElement(bb, k).text = str(v)

        def size(root):
            root.find("size").find("width").text = str(F.W * 2)

        return _edit_xml(xml, {"box_outside": box_out, "unknown_label": unknown, "size_mismatch": size}[case])

    df, report = _bad_case(copy_of, tmp_path, "m2cai16", damage, reason)
    assert len(report) == 1


# --- CholecTrack20 -----------------------------------------------------------------------------------

def test_cholectrack20_index(pristine, tmp_path):
    cfg, folder = pristine["cholectrack20"]
    df, meta = _index("cholectrack20", cfg, folder.parent, tmp_path / "idx")
    assert df["video_id"].nunique() == 20 and {"VID30", "VID31"} <= set(df["video_id"])  # exclusion is re-curation's job
    assert dict(df.groupby("video_id")["split"].first()[["VID02", "VID110", "VID12"]]) == {
        "VID02": "train", "VID110": "val", "VID12": "test"}
    doc = json.loads((folder / "Testing" / "VID12" / "VID12.json").read_text())
    first = min(doc["annotations"], key=int)
    row = df[(df["video_id"] == "VID12") & (df["frame"] == int(first))].iloc[0]
    assert Path(row.image_path).name == f"{int(first):06d}.png"
    want = [(TOOL_CLASSES[r["instrument"]], r["tool_bbox"][0] * F.W, r["tool_bbox"][1] * F.H) for r in doc["annotations"][first]]
    got = [(b.cls, b.x1, b.y1) for b in parse_boxes(row.boxes)]
    assert [(c, pytest.approx(x, abs=1e-3), pytest.approx(y, abs=1e-3)) for c, x, y in want] == got
    assert len(df) == sum(len(json.loads(p.read_text())["annotations"]) for p in folder.glob("*/*/VID*.json"))


def _ct_json(folder, vid="VID04"):
    return folder / "Training" / vid / f"{vid}.json"


@pytest.mark.parametrize("case,reason", [
    ("json_parse", "does not parse"),
    ("box_outside", "outside"),
    ("unknown_instrument", "not in the tool map"),
    ("unreadable_image", "unreadable"),
])
def test_cholectrack20_bad_files(copy_of, tmp_path, case, reason):
    def damage(folder):
        path = _ct_json(folder)
        if case == "json_parse":
            path.write_text('{"annotations": {"1": [')
            return path
        if case == "unreadable_image":
            img = sorted((folder / "Training" / "VID04" / "Frames").glob("*.png"))[0]
            F.garbage(img)
            return img
        doc = json.loads(path.read_text())
        key = min(doc["annotations"], key=int)
        rec = {"instrument": 0, "tool_bbox": [0.8, 0.2, 0.5, 0.1]}
        if case == "unknown_instrument":
            rec = {"instrument": 9, "tool_bbox": [0.1, 0.1, 0.1, 0.1]}
        doc["annotations"][key].append(rec)
        path.write_text(json.dumps(doc))
        return path

    df, report = _bad_case(copy_of, tmp_path, "cholectrack20", damage, reason)
    if case == "json_parse":  # the whole video is unusable and reported once
        assert "VID04" not in set(df["video_id"]) and len(report) == 1


# --- generic YOLO and COCO folders -----------------------------------------------------------------------

def test_yolo_folder(tmp_path):
    folder = F.write_yolo_folder(tmp_path)
    cfg = {"layout": "yolo", "folder": folder.name}
    df, meta = _index("yolo_ds", cfg, tmp_path, tmp_path / "idx")
    assert meta["classes"] == ["grasper", "hook", "gauze"] and meta["fps"] is None and df["timestamp_s"].isna().all()
    assert set(df["video_id"]) == {"caseA", "caseB", "caseC"} and set(df["split"]) == {"train", "val"}
    b = parse_boxes(df.iloc[0].boxes)[0]
    assert b.cls == "grasper" and (b.x1, b.y1, b.x2, b.y2) == pytest.approx((24, 12, 40, 36))


@pytest.mark.parametrize("case,reason", [
    ("class_id", "not in the 3 names"), ("outside", "outside"), ("name", "does not match video_regex"),
    ("unreadable_image", "unreadable")])
def test_yolo_folder_bad_files(tmp_path, case, reason):
    folder = F.write_yolo_folder(tmp_path)
    lab = folder / "labels" / "train" / "caseA_00010.txt"
    path = lab
    if case == "class_id":
        lab.write_text("7 0.5 0.5 0.1 0.1\n")
    elif case == "outside":
        lab.write_text("0 0.95 0.5 0.3 0.1\n")
    elif case == "name":
        path = folder / "images" / "train" / "caseA_00010.jpg"
        path = path.rename(path.with_name("nonumber.jpg"))
        lab.rename(lab.with_name("nonumber.txt"))
    else:
        path = folder / "images" / "train" / "caseA_00010.jpg"
        F.garbage(path)
    cfg = {"layout": "yolo", "folder": folder.name}
    with pytest.raises(BadFileError, match=reason):
        _index("y", cfg, tmp_path, tmp_path / "idx")
    df, _ = _index("y", cfg, tmp_path, tmp_path / "idx", policy="skip-and-report")
    report = pd.read_csv(tmp_path / "idx" / "bad_files.csv")
    assert report["path"].tolist() == [str(path)] and len(df) == 8


def test_coco_folder(tmp_path):
    folder = F.write_coco_folder(tmp_path)
    df, meta = _index("c", {"layout": "coco", "folder": folder.name}, tmp_path, tmp_path / "idx")
    assert meta["classes"] == ["scissors"] and len(df) == 6 and set(df["split"]) == {"train", "test"}
    assert [b.as_list() for b in parse_boxes(df.iloc[0].boxes)] == [["scissors", 4.0, 6.0, 24.0, 16.0]]


@pytest.mark.parametrize("case,reason", [("json", "does not parse"), ("outside", "outside"),
                                         ("category", "not in categories")])
def test_coco_folder_bad_files(tmp_path, case, reason):
    folder = F.write_coco_folder(tmp_path)
    path = folder / "annotations" / "instances_train.json"
    if case == "json":
        path.write_text("{")
    else:
        doc = json.loads(path.read_text())
        if case == "outside":
            doc["annotations"][0]["bbox"] = [50, 6, 40, 10]
        else:
            doc["annotations"][0]["category_id"] = 99
        path.write_text(json.dumps(doc))
    with pytest.raises(BadFileError, match=reason):
        _index("c", {"layout": "coco", "folder": folder.name}, tmp_path, tmp_path / "idx")


# --- EndoVis2017 ------------------------------------------------------------------------------------------

def test_endovis2017_merges_instrument_part_masks(pristine, tmp_path):
    cfg, folder = pristine["endovis2017"]
    df, meta = _index("endovis2017", cfg, folder.parent, tmp_path / "idx")
    assert meta["classes"] == list(PART_CLASSES) and meta["fps"] == 5.0
    # test sequences 1-2 continue the training procedures (frames 5..7), sequence 3 is new
    ds1 = df[df["video_id"] == "instrument_dataset_1"]
    assert ds1.groupby("split")["frame"].agg(list).to_dict() == {"train": [0, 1, 2, 3, 4], "test": [5, 6, 7]}
    assert set(df[df["video_id"] == "instrument_dataset_3"]["split"]) == {"test"}
    row = df.iloc[2]
    merged = cv2.imread(row.mask_path, cv2.IMREAD_UNCHANGED)
    gt = Path(row.image_path).parent.parent / "ground_truth"
    expect = np.zeros_like(merged)
    for d in sorted(gt.iterdir()):
        if d.name != "Other_labels":
            raw = cv2.imread(str(d / Path(row.image_path).name), cv2.IMREAD_UNCHANGED)
            expect = np.where(raw > 0, raw // 10, expect)
    assert np.array_equal(merged, expect) and set(np.unique(merged)) <= {0, 1, 2, 3} and merged.max() == 3
    assert df["labelled"].all()


@pytest.mark.parametrize("case,reason", [("size", "differs from the image size"), ("value", "not in the label map"),
                                         ("unreadable", "unreadable")])
def test_endovis2017_bad_masks(copy_of, tmp_path, case, reason):
    def damage(folder):
        d = [d for d in sorted((folder / "train" / "instrument_dataset_1" / "ground_truth").iterdir())
             if d.name != "Other_labels"][0]
        p = d / "frame001.png"
        if case == "size":
            cv2.imwrite(str(p), np.zeros((F.H + 2, F.W), np.uint8))
        elif case == "value":
            m = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
            m[0, 0] = 50
            cv2.imwrite(str(p), m)
        else:
            F.garbage(p)
        return p

    df, report = _bad_case(copy_of, tmp_path, "endovis2017", damage, reason)
    assert not ((df["video_id"] == "instrument_dataset_1") & (df["frame"] == 1)).any()


def test_endovis2017_other_labels_only_when_asked(copy_of, tmp_path):
    cfg, root, folder = copy_of("endovis2017")
    p = folder / "train" / "instrument_dataset_1" / "ground_truth" / "Other_labels" / "frame000.png"
    m = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
    m[:4, :4] = 50
    cv2.imwrite(str(p), m)
    _index("e", cfg, root, tmp_path / "a")  # skipped by default
    with pytest.raises(BadFileError, match=r"\[50\] not in the label map"):
        _index("e", {**cfg, "exclude_label_dirs": []}, root, tmp_path / "b")


def test_endovis2017_probe_value_is_background(copy_of, tmp_path):
    """The release's parts_mapping.json has Probe = 40 besides 10/20/30: background, not a bad file."""
    cfg, root, folder = copy_of("endovis2017")
    d = [d for d in sorted((folder / "train" / "instrument_dataset_1" / "ground_truth").iterdir())
         if d.name != "Other_labels"][0]
    m = np.zeros((F.H, F.W), np.uint8)
    m[:4, :4], m[4:8, :4], m[8:12, :4], m[12:16, :4] = 10, 20, 30, 40
    cv2.imwrite(str(d / "frame000.png"), m)
    for other in (o for o in d.parent.iterdir() if o != d and o.name != "Other_labels"):
        cv2.imwrite(str(other / "frame000.png"), np.zeros((F.H, F.W), np.uint8))
    df, _ = _index("e", cfg, root, tmp_path / "idx")
    row = df[(df["video_id"] == "instrument_dataset_1") & (df["frame"] == 0)].iloc[0]
    merged = cv2.imread(row.mask_path, cv2.IMREAD_UNCHANGED)
    assert [int(merged[r, 0]) for r in (0, 4, 8, 12)] == [1, 2, 3, 0]


@pytest.mark.parametrize("under_ground_truth", [False, True])
def test_endovis2017_test_release_parts_segmentation_values(copy_of, tmp_path, under_ground_truth):
    """The test label release: one merged PartsSegmentation mask per frame, 30 shaft, 100 wrist,
    255 clasper, 200 probe; Binary/TypeSegmentation beside it are not part masks."""
    cfg, root, folder = copy_of("endovis2017")
    vdir = folder / "test" / "instrument_dataset_3"
    shutil.rmtree(vdir / "ground_truth")
    base = vdir / "ground_truth" if under_ground_truth else vdir
    frames = sorted((vdir / "left_frames").iterdir())
    m = np.zeros((F.H, F.W), np.uint8)
    m[:4, :4], m[4:8, :4], m[8:12, :4], m[12:16, :4] = 30, 100, 255, 200
    for f in frames:
        for sub, mask in (("PartsSegmentation", m), ("BinarySegmentation", (m > 0).astype(np.uint8) * 255),
                          ("TypeSegmentation", (m > 0).astype(np.uint8) * 2)):
            (base / sub).mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(base / sub / f.name), mask)
    df, _ = _index("e", cfg, root, tmp_path / "idx")
    rows = df[df["video_id"] == "instrument_dataset_3"]
    assert len(rows) == len(frames) and rows["labelled"].all()
    merged = cv2.imread(rows.iloc[0].mask_path, cv2.IMREAD_UNCHANGED)
    assert [int(merged[r, 0]) for r in (0, 4, 8, 12)] == [1, 2, 3, 0]


# --- EndoVis2018 ------------------------------------------------------------------------------------------

def test_endovis2018_colours_to_parts(pristine, tmp_path):
    cfg, folder = pristine["endovis2018"]
    df, meta = _index("endovis2018", cfg, folder.parent, tmp_path / "idx")
    assert set(df["video_id"]) == {"train-seq_1", "train-seq_2", "test-seq_1"}
    row = df.iloc[0]
    mask = cv2.imread(row.mask_path, cv2.IMREAD_UNCHANGED)
    label = cv2.imread(str(Path(row.image_path).parent.parent / "labels" / Path(row.image_path).name))[..., ::-1]
    assert np.array_equal(mask == 1, np.all(label == (0, 255, 0), axis=-1))  # instrument-shaft
    assert np.array_equal(mask == 3, np.all(label == (0, 255, 255), axis=-1))  # instrument-clasper
    kidney = np.all(label == (255, 55, 0), axis=-1)
    assert kidney.any() and (mask[kidney] == 0).all()  # other scene classes -> background


@pytest.mark.parametrize("case,reason", [("colour", "not in the colour map"), ("size", "differs from the image size")])
def test_endovis2018_bad_labels(copy_of, tmp_path, case, reason):
    def damage(folder):
        p = folder / "train" / "miccai_challenge_2018_release_1" / "seq_1" / "labels" / "frame002.png"
        if case == "colour":
            lab = cv2.imread(str(p))
            lab[0, 0] = (1, 2, 3)
            cv2.imwrite(str(p), lab)
        else:
            cv2.imwrite(str(p), np.zeros((F.H, F.W + 4, 3), np.uint8))
        return p

    _bad_case(copy_of, tmp_path, "endovis2018", damage, reason)


# --- generic frames + masks ------------------------------------------------------------------------------------

def test_frames_masks(pristine, tmp_path):
    cfg, folder = pristine["rarp"]
    df, meta = _index("rarp", cfg, folder.parent, tmp_path / "idx")
    assert meta["label_set"] == "parts" and meta["fps"] == 5.0
    v = df[df["video_id"] == "video_01"]
    assert v["labelled"].tolist() == [True, False] * 3  # label_every 2: in-between frames are history only
    assert (v[~v["labelled"]]["mask_path"] == "").all()
    with pytest.raises(ValueError, match="fps is not set"):
        _index("rarp", {**cfg, "fps": None}, folder.parent, tmp_path / "x")


def test_frames_masks_binary_label_set(pristine, tmp_path):
    cfg, folder = pristine["rarp"]
    cfg = {**cfg, "label_set": "binary", "label_values": {0: "background", 1: "instrument", 2: "instrument",
                                                          3: "instrument"}}
    df, meta = _index("rarp", cfg, folder.parent, tmp_path / "idx")
    assert meta["classes"] == ["background", "instrument"]
    m = cv2.imread(df[df["labelled"]].iloc[0].mask_path, cv2.IMREAD_UNCHANGED)
    assert set(np.unique(m)) == {0, 1}


@pytest.mark.parametrize("case,reason", [("value", "not in the label map"), ("size", "differs from the image size")])
def test_frames_masks_bad(copy_of, tmp_path, case, reason):
    def damage(folder):
        p = folder / "train" / "video_02" / "masks" / "000002.png"
        m = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
        if case == "value":
            m[1, 1] = 9
            cv2.imwrite(str(p), m)
        else:
            cv2.imwrite(str(p), m[:-3])
        return p

    _bad_case(copy_of, tmp_path, "rarp", damage, reason)
