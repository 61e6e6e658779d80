"""engine.image_cache: decoded frames shared on disk by the detection jobs, read by Ultralytics' loader
instead of decoding (the same arrays, so the same samples), written once, atomically, and never stale; stored
at the training size, what Ultralytics' loader makes of a frame (decoded and resized), read through
sized_frames."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import surgical as F

from fedmedbench.data.surgical.fsutil import sorted_images
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.detection import frame_cache as FC
from fedmedbench.fl.tasks.detection.sized_frames import SizedFrameLoader, read_sized_frames


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return F.yolo_setting(tmp_path_factory.mktemp("fc"), 2)


def _spec(export: Path, run_dir: Path, cache: Path | None) -> RunSpec:
    spec = RunSpec(run_dir=str(run_dir), study="ultraflwr", dataset="g", setting="a", method="ultraflwr", seed=0,
                   partition_path=str(export), sources={}, image_size=64, model="yolo11n.yaml",
                   train={"rounds": 1, "local_epochs": 1, "batch_size": 4, "lr": 0.01},
                   method_params={"strategy": "FedAvg"}, task="detection", device="cpu",
                   image_cache=None if cache is None else str(cache))
    return fed.resolve_data_shapes(spec)


def _dataset(images: Path, imgsz: int = 64, mode: str = "train", sized: bool = True):
    """The study's Ultralytics dataset on ``images`` (8.3.48's HSV step; the stored frames read where linked)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    from fedmedbench.fl.tasks.detection.yolo import _use_83_hsv

    data = check_det_dataset(str(images.parents[1] / "data.yaml"))
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": 4, "workers": 0, "seed": 0, "deterministic": True})
    dataset = build_yolo_dataset(cfg, str(images), 4, data, mode=mode, rect=mode == "val", stride=32)
    if sized:
        read_sized_frames(dataset)
    if mode == "train":
        _use_83_hsv(dataset)
    return dataset


def _samples(train_images: Path, n: int = 12, imgsz: int = 64, sized: bool = True) -> tuple[list[torch.Tensor], int]:
    """Ultralytics' training samples (mosaic and augmentation on, drawn from a fixed seed) and how many
    images it decoded for them."""
    import ultralytics.data.base as base

    dataset = _dataset(train_images, imgsz, sized=sized)
    decoded = []
    real = base.imread
    base.imread = lambda *a, **k: decoded.append(a[0]) or real(*a, **k)
    try:
        random.seed(0)
        np.random.seed(0)
        samples = [dataset[i % len(dataset)]["img"] for i in range(n)]
    finally:
        base.imread = real
    return samples, len(decoded)


def test_cached_frames_give_ultralytics_the_same_samples_without_decoding_them(export, tmp_path):
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    plain = DetectionTask(_spec(export, tmp_path / "plain", None))
    cached = DetectionTask(_spec(export, tmp_path / "cached", tmp_path / "frames"))
    images = plain.stage / "client_0" / "train" / "images"
    assert not list(images.glob("*.npy"))
    want, decoded_plain = _samples(images)
    got, decoded_cached = _samples(cached.stage / "client_0" / "train" / "images")
    assert decoded_plain > 0 and decoded_cached == 0  # every frame read from its stored file
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    for split in ("train", "val", "test", "test_cd"):  # every frame the job reads, at the training size (64 px)
        frames = sorted_images(cached.stage / "client_0" / split / "images")
        assert frames and all(FC.sized_link(img, 64).exists() for img in frames)
        assert not any(img.with_suffix(".npy").exists() for img in frames)  # not the full-size files as well


@pytest.mark.parametrize("imgsz", [32, 64, 96])  # shrunk, as stored (64x48 frames), enlarged
def test_frames_stored_at_training_size_are_ultralytics_own_load_and_give_the_same_samples(export, tmp_path, imgsz):
    from fedmedbench.fl.tasks.detection.staging import stage_export

    stage = stage_export(export, tmp_path / "stage")
    plain = stage_export(export, tmp_path / "plain")
    folders = [stage / "client_0" / split / "images" for split in ("train", "val")]
    report = FC.link_cached_frames(folders, tmp_path / "frames", log=lambda m: None, imgsz=imgsz)
    frames = sorted_images(folders[0])
    assert report.decoded == len(frames) + len(sorted_images(folders[1])) and not report.unreadable
    stored = np.load(FC.sized_link(frames[0], imgsz))
    assert stored.shape == (*FC.resized_shape(48, 64, imgsz), 3)  # the long side at imgsz
    assert FC.original_shape(FC.sized_link(frames[0], imgsz).resolve()) == (48, 64)
    # more samples than frames: the mosaic buffer fills, evicts and draws from the frames the stored path put there
    n = 3 * len(frames)
    want, _ = _samples(plain / "client_0" / "train" / "images", n, imgsz, sized=False)
    got, decoded = _samples(folders[0], n, imgsz)
    assert decoded == 0 and all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    # validation (rect batches, no augmentation): the same image, original and resized shape for every frame
    own, read = _dataset(plain / "client_0" / "val" / "images", imgsz, "val", sized=False), _dataset(folders[1], imgsz, "val")
    assert isinstance(read.load_image, SizedFrameLoader)
    for i in range(len(read)):
        (a, hw0_a, hw_a), (b, hw0_b, hw_b) = own.load_image(i), read.load_image(i)
        assert np.array_equal(a, b) and tuple(hw0_a) == tuple(hw0_b) and tuple(hw_a) == tuple(hw_b)
        assert np.array_equal(own[i]["img"], read[i]["img"]) and own[i]["ratio_pad"] == read[i]["ratio_pad"]


def test_a_stored_frame_that_is_not_ultralytics_own_load_is_not_read(export, tmp_path):
    from fedmedbench.fl.tasks.detection.staging import stage_export

    images = stage_export(export, tmp_path / "stage") / "client_0" / "train" / "images"
    FC.link_cached_frames([images], tmp_path / "frames", log=lambda m: None, imgsz=32)
    first = FC.sized_link(sorted_images(images)[0], 32).resolve()
    np.save(first, np.load(first) ^ 1)  # another resize rule (or a changed Ultralytics) would store other bits
    said: list[str] = []
    dataset = _dataset(images, 32, sized=False)
    assert read_sized_frames(dataset, log=said.append) == 0 and "not what Ultralytics loads" in said[0]
    assert not isinstance(dataset.load_image, SizedFrameLoader)
    assert read_sized_frames(_dataset(images, 64, sized=False)) == 0  # nothing stored at 64 px: decoded as usual


def test_a_frame_is_decoded_once_for_every_job_and_stage(export, tmp_path):
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    cache = tmp_path / "frames"
    first = FC.link_cached_frames([DetectionTask(_spec(export, tmp_path / "a", None)).stage / "client_0" / "train"
                                   / "images"], cache, workers=2, log=lambda m: None)
    stage_b = DetectionTask(_spec(export, tmp_path / "b", None)).stage / "client_0" / "train" / "images"
    pooled_b = stage_b.parents[2] / "pooled" / "train" / "images"  # the clients' frames again
    again = FC.link_cached_frames([stage_b, pooled_b], cache, log=lambda m: None)
    assert again.decoded == len(sorted_images(pooled_b)) - len(sorted_images(stage_b))  # the other clients' only
    assert first.decoded == len(sorted_images(stage_b)) > 0 and first.bytes_written > 0
    assert again.reused == first.decoded
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    assert len(files) == len(sorted_images(pooled_b)) and all(p.suffix == ".npy" for p in files)  # no temporary file
    last = FC.link_cached_frames([stage_b, pooled_b], cache, log=lambda m: None)
    assert last.decoded == 0 and last.bytes_written == 0 and last.reused == len(files)
    assert all(os.path.realpath(img.with_suffix(".npy")) in {str(f) for f in files} for img in sorted_images(stage_b))
    assert dataclasses.replace(_spec(export, tmp_path / "c", None), image_cache=str(cache)).run_hash() == \
        _spec(export, tmp_path / "c", None).run_hash()  # the same results: not in the run hash


def test_a_frame_changed_after_its_file_is_decoded_again(tmp_path):
    import cv2

    folder = tmp_path / "images"
    folder.mkdir()
    img = folder / "f.png"
    for value, when in ((10, 1_600_000_000), (200, 1_700_000_000), (90, 1_000_000_000)):  # the last one dated earlier
        cv2.imwrite(str(img), np.full((6, 8, 3), value, np.uint8))
        os.utime(img, (when, when))
        report = FC.link_cached_frames([folder], tmp_path / "c", log=lambda m: None)
        assert report.decoded == 1 and int(np.load(img.with_suffix(".npy"))[0, 0, 0]) == value
        assert img.with_suffix(".npy").stat().st_mtime >= img.stat().st_mtime  # what Ultralytics checks to read it
    assert FC.link_cached_frames([folder], tmp_path / "c", log=lambda m: None).decoded == 0


def test_a_frame_changed_after_it_was_stored_at_training_size_is_stored_again(tmp_path):
    import cv2

    folder = tmp_path / "images"
    folder.mkdir()
    img = folder / "f.png"
    for value, when, shape in ((10, 1_600_000_000, (48, 64)), (200, 1_000_000_000, (64, 32))):  # dated earlier too
        cv2.imwrite(str(img), np.full((*shape, 3), value, np.uint8))
        os.utime(img, (when, when))
        report = FC.link_cached_frames([folder], tmp_path / "c", log=lambda m: None, imgsz=32)
        stored = FC.sized_link(img, 32).resolve()
        assert report.decoded == 1 and FC.original_shape(stored) == shape
        assert np.load(stored).shape == (*FC.resized_shape(*shape, 32), 3) and int(np.load(stored)[0, 0, 0]) == value
    assert FC.link_cached_frames([folder], tmp_path / "c", log=lambda m: None, imgsz=32).reused == 1


def test_a_damaged_frame_is_named_and_left_to_ultralytics_and_too_little_disk_caches_nothing(tmp_path, monkeypatch):
    """A frame that does not decode is read as without the cache (Ultralytics skips or names it as usual)."""
    import cv2

    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.zeros((6, 8, 3), np.uint8))
    F.garbage(folder / "b.png")
    (folder / "gone.png").symlink_to(tmp_path / "no-such-frame.png")  # a frame missing behind its stage link
    said: list[str] = []
    report = FC.link_cached_frames([folder], tmp_path / "c", log=said.append)
    assert report.decoded == 1 and len(report.unreadable) == 1 and "b.png: not a readable image" in said[-1]
    assert (folder / "a.npy").exists() and not (folder / "b.npy").exists()
    (folder / "b.png").unlink()
    (folder / "a.npy").unlink()
    with pytest.raises(OSError, match=r"engine.image_cache: cannot make the folder .*not_a_folder"):
        (tmp_path / "not_a_folder").write_text("")
        FC.link_cached_frames([folder], tmp_path / "not_a_folder", log=said.append)
    said.clear()
    monkeypatch.setattr(FC.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 90, 10))  # 10 bytes free
    report = FC.link_cached_frames([folder], tmp_path / "d", log=said.append)
    assert report.decoded == 0 and report.skipped and "free" in said[0]
    assert not list(folder.glob("*.npy")) and not [p for p in (tmp_path / "d").rglob("*") if p.is_file()]


def test_a_write_that_fails_leaves_no_file(tmp_path, monkeypatch):
    def broken(path, array, allow_pickle):
        Path(path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(FC.np, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        FC.write_npy(tmp_path / "x" / "f.npy", np.zeros(3))
    assert not [p for p in (tmp_path / "x").iterdir()]


def test_the_loading_bench_draws_the_same_samples_both_ways(export, tmp_path, monkeypatch):
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import yolo_loading

    (tmp_path / "sd" / "yolo").mkdir(parents=True)
    (tmp_path / "sd" / "yolo" / "g").symlink_to(export.parents[1])  # <dir>/yolo/<group>/<setting>/manifest.json
    monkeypatch.setattr(sys, "argv", ["yolo_loading.py", "--surgical-dir", str(tmp_path / "sd"), "--group", "g",
                                      "--setting", "a", "--samples", "8", "--imgsz", "64", "--out", str(tmp_path / "r")])
    yolo_loading.main()
    row = json.loads((tmp_path / "r").read_text())
    assert row["same_samples"] and row["frames"] > 0 and row["decode_ms_per_sample"] > 0
    assert row["cache_bytes_per_frame"] == 48 * 64 * 3 + 128  # one BGR frame and the .npy header
    assert row["sized_bytes_per_frame"] == 48 * 64 * 3 + 128  # 64 px: the frame's own size
    assert set(row["images_per_s"]) == {"decoded", "npy", "sized", "sized_thread"} and row["samples"] == 8
    assert row["sized_read_ms_per_sample"] > 0 and row["sized_thread_speedup"] > 0
