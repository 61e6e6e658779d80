"""The surgical grids' cost without the licensed videos: stand-ins at the papers' frame counts
(bench/surgical_stand_in.py) and the cost arithmetic that scales a timed fraction back up
(bench/_surgical_cost.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import _surgical_cost as SC  # noqa: E402
import grid_cost  # noqa: E402
import surgical_stand_in as SI  # noqa: E402

from fedmedbench.data.surgical import facts  # noqa: E402
from fedmedbench.fl.tasks.detection import yolo  # noqa: E402

STUDIES = BENCH.parent / "config" / "studies"
SPEC = yaml.safe_load((BENCH / "surgical_stand_in.yaml").read_text())

#: (training, test) frames as published: FedST Table I (site A without the two 300-frame test procedures,
#: as config/studies/fedst.yaml leaves them out) and UltraFlwr Sec. III-A (all frames of a dataset)
PUBLISHED = {**{k: (v.train or 0, v.test or 0) for k, v in facts.TABLE_I.items()},
             **{k: (v.frames, 0) for k, v in facts.PUBLISHED.items()}}
LEFT_OUT = {"endovis2017": 2}  # test-only procedures 9 and 10 (excluded by the study config)


def _frames(name: str) -> tuple[int, int]:
    e = SPEC["datasets"][name]
    if name == "cholectrack20":
        return 18 * e["frames"], 0  # the release's 20 ids less VID30/31, whose frames the study drops
    train = (e.get("videos") or 0) * e["frames"]
    test = ((e.get("test_videos") or 0) - LEFT_OUT.get(name, 0)) * e.get("test_frames", e["frames"])
    return train, test


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_stand_in_has_the_papers_frame_counts(name):
    train, test = _frames(name)
    want_train, want_test = PUBLISHED[name]
    assert train == pytest.approx(want_train, rel=0.002, abs=1) and test == pytest.approx(want_test, rel=0.002, abs=1)


def _tiny_spec(tmp_path: Path) -> Path:
    """The stand-in spec with small frames (the counts are the papers')."""
    spec = yaml.safe_load((BENCH / "surgical_stand_in.yaml").read_text())
    for entry in spec["datasets"].values():
        entry["width"], entry["height"] = 64, 48
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_ultraflwr_stand_in_writes_the_exports_at_the_fraction_asked(tmp_path):
    """Every video keeps round(fraction x its frames); the YOLO exports of every group and setting exist; the
    recorded fraction is what was written over what the papers have; repeated frames are hard links."""
    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    record = SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)
    counts = record["labelled_frames"]
    assert sum(counts["cholectrack20"].values()) == 20 * round(1735 * 0.01)
    assert sum(counts["m2cai16"].values()) == 10 * round(281 * 0.01)
    written = 18 * 17 + 10 * 3  # without VID30/31
    assert record["fraction"] == pytest.approx(written / (18 * 1735 + 10 * 281), rel=0.05)
    for group, settings in config["ultraflwr"]["groups"].items():
        for setting in settings:
            manifest = json.loads((tmp_path / "si" / "yolo" / group / setting / "manifest.json").read_text())
            assert sum(c["counts"]["train"]["frames"] for c in manifest["clients"]) > 0
    frames = sorted((tmp_path / "si" / "raw" / "CholecTrack20" / "Training" / "VID02" / "Frames").iterdir())
    assert len(frames) == 17 and frames[0].stat().st_ino == frames[8].stat().st_ino  # 8 distinct, then repeats
    assert json.loads((tmp_path / "si" / "stand_in.json").read_text())["origin"] == "synthetic"
    with pytest.raises(SystemExit, match="one --fraction"):
        SI.build(config, tmp_path / "si2", 0.01, 0.5, spec_file=_tiny_spec(tmp_path))
    for fractions in ((0.0, None), (1.0, 0.0), (1.5, None)):
        with pytest.raises(SystemExit, match=r"fractions must be in \(0, 1\]"):
            SI.build(grid_cost.load_config(STUDIES / "fedst.yaml"), tmp_path / "si2", *fractions,
                     spec_file=_tiny_spec(tmp_path))
    assert not (tmp_path / "si2").exists()


def test_fedst_stand_in_keeps_every_training_frame_and_a_share_of_the_test_frames(tmp_path):
    config = grid_cost.load_config(STUDIES / "fedst.yaml")
    record = SI.build(config, tmp_path / "si", 1.0, 0.1, spec_file=_tiny_spec(tmp_path), jobs=2, log=lambda m: None)
    counts = record["labelled_frames"]
    assert counts["endovis2017"]["train"] == 1800 and counts["endovis2018"]["train"] == 2235
    assert counts["endovis2017"]["test"] == 10 * round(75 * 0.1)  # procedures 9 and 10 included, as released
    assert record["fraction"] == 1.0
    assert record["test_fraction"] == pytest.approx(0.1, rel=0.1)
    sites = json.loads((tmp_path / "si" / "clips" / "sites.json").read_text())["sites"]
    assert set(sites) == set(config["surgical"]["sites"])
    assert sites["A"]["excluded_videos"] == ["instrument_dataset_10", "instrument_dataset_9"]


def test_fractions_are_what_was_written_over_what_the_papers_have():
    entries = {"a": {"frames": 100, "test_frames": 10}, "b": {"frames": 50}, "token": {"frames": 4, "fixed": True}}
    specs = {"a": {"frames": [10, 10], "test_frames": [1, 1]}, "b": {"frames": [5, 5]}, "token": {"frames": [4, 4]}}
    counts = {"a": {"train": 30, "val": 0, "test": 2}, "b": {"train": 10, "val": 5, "test": 5},
              "token": {"train": 0, "val": 0, "test": 4}}
    kept, kept_test = SI.effective_fractions(entries, specs, counts)
    assert kept == pytest.approx(45 / (300 + 150))  # (30 + 15) written of 300 + 150
    assert kept_test == pytest.approx(7 / (20 + 50))  # a: 2 of 20, b: 5 of 50; the token set left out


def _trainer(epoch: int, epochs: int) -> SimpleNamespace:
    model = torch.nn.Linear(1, 1)
    metrics = {"metrics/mAP50(B)": 0.5, "metrics/mAP50-95(B)": 0.3, "fitness": 0.32}
    return SimpleNamespace(metrics=metrics, epoch=epoch, epochs=epochs, stop=False, validated_epoch=epoch,
                           ema=SimpleNamespace(ema=model))


def test_epoch_clock_times_each_local_training_and_then_lets_go(monkeypatch):
    """A training starts at its second selector (the first only checks the arguments) and an epoch ends at
    each selector call; outside the clock the selector is untouched."""
    now = iter([10.0, 12.0, 15.0, 18.0, 30.0, 41.0, 44.0, 47.0])
    monkeypatch.setattr(SC.time, "perf_counter", lambda: next(now))
    with SC.epoch_clock() as calls:
        for _ in range(2):  # two trainings of 2 epochs, as train_yolo makes them
            yolo.EpochSelector("best", "fitness")
            selector = yolo.EpochSelector("best", "fitness")
            for epoch in range(2):
                selector(_trainer(epoch, 2))
    assert calls == [{"start": 12.0, "epoch_ends": [15.0, 18.0]}, {"start": 41.0, "epoch_ends": [44.0, 47.0]}]
    assert SC.split_trainings(calls) == (0.0, 3.0)
    assert "timed" not in yolo.EpochSelector.__init__.__qualname__
    assert "timed" not in yolo.EpochSelector.__call__.__qualname__


def test_a_local_training_splits_into_set_up_and_epochs():
    calls = [{"start": 0.0, "epoch_ends": [5.0, 8.0, 11.0]}, {"start": 20.0, "epoch_ends": [24.0, 27.0]},
             {"start": 30.0, "epoch_ends": [31.0]}]  # one epoch only: nothing to split, left out
    setup, epoch = SC.split_trainings(calls)
    assert epoch == pytest.approx(3.0) and setup == pytest.approx((2.0 + 1.0) / 2)
    with pytest.raises(ValueError, match="at least 2"):
        SC.split_trainings(calls[2:])


def test_a_paper_round_scales_the_epochs_to_all_frames_and_keeps_the_set_up():
    """3 clients, 2 timed epochs of 3 s each: a 20 s timed round = 18 s of epochs + 2 s of the rest; the
    paper round has 20 epochs of all frames (a 5 % stand-in: x 20)."""
    calls = [{"start": 10.0 * i, "epoch_ends": [10.0 * i + 4.0, 10.0 * i + 7.0]} for i in range(9)]  # 3 rounds
    parts = SC.paper_round(20.0, calls, 3, 2, 20, 0.05)
    assert parts["clients"] == 3 and parts["client_epoch_s"] == pytest.approx(3.0)
    assert parts["client_setup_s"] == pytest.approx(1.0) and parts["overhead_s"] == pytest.approx(2.0)
    assert parts["train_s"] == pytest.approx(2.0 + 20 * 3 * 3.0 / 0.05)


def test_fedst_cost_scales_an_evaluation_by_the_test_fraction_only(monkeypatch, tmp_path):
    """Training runs a fixed number of steps whatever the frames; an evaluation reads test_fraction of them."""
    config = grid_cost.load_config(STUDIES / "fedst.yaml")
    config["fedst"]["pretrain"]["enabled"] = False
    surgical = tmp_path / "si"
    (surgical / "clips").mkdir(parents=True)
    (surgical / "clips" / "sites.json").write_text("{}")
    (surgical / "stand_in.json").write_text(json.dumps({"fraction": 1.0, "test_fraction": 0.25, "distinct_frames": 8}))
    specs = []
    monkeypatch.setattr(SC, "time_spec", lambda spec: specs.append(spec) or [9.0, 2.0, 2.0, 3.0])  # round 4: a 1 s evaluation
    row = SC.fedst_cost(config, STUDIES / "fedst.yaml", ["fedst"], 4, "cpu", 1, tmp_path / "w", surgical)
    assert row["train_s_per_round"] == {"fedst": 2.0} and row["eval_s"] == {"fedst": 4.0}
    assert row["test_fraction"] == 0.25 and "SYNTHETIC stand-in" in row["data"]
    # the clips decode ahead in the study's threads (engine.loader_workers), or in as many as asked for
    assert specs[0].loader_workers == config["engine"]["loader_workers"] == row["loader_workers"] == 4
    row = SC.fedst_cost(config, STUDIES / "fedst.yaml", ["fedst"], 4, "cpu", 1, tmp_path / "w", surgical, workers=8)
    assert specs[1].loader_workers == row["loader_workers"] == 8
    # every training clip: the paper's clip cache; a quarter of them: a quarter of the cache (the same share of
    # the clips the steps draw from)
    assert config["fedst"]["data"]["cache_mb"] == 4096
    assert specs[0].task_params["cache_mb"] == row["cache_mb"] == 4096
    (surgical / "stand_in.json").write_text(json.dumps({"fraction": 0.25, "test_fraction": 0.25, "distinct_frames": 8}))
    row = SC.fedst_cost(config, STUDIES / "fedst.yaml", ["fedst"], 4, "cpu", 1, tmp_path / "w", surgical)
    assert specs[2].task_params["cache_mb"] == row["cache_mb"] == 1024
    assert row["train_s_per_round"] == {"fedst": 2.0}  # the same fixed steps: not scaled by the fraction
    # the decoded clips on disk (engine.image_cache): the config's folder (the grid's default) or the bench's
    assert specs[0].image_cache == config["engine"]["image_cache"] == "resources/cache/clips" and row["image_cache"]
    row = SC.fedst_cost(config, STUDIES / "fedst.yaml", ["fedst"], 4, "cpu", 1, tmp_path / "w", surgical,
                        image_cache=str(tmp_path / "clips-on-disk"))
    assert specs[3].image_cache == str(tmp_path / "clips-on-disk") and row["image_cache"]
    row = SC.fedst_cost(config, STUDIES / "fedst.yaml", ["fedst"], 4, "cpu", 1, tmp_path / "w", surgical,
                        image_cache="")  # grid_cost --no-image-cache: every read decoded
    assert specs[4].image_cache is None and not row["image_cache"]


def test_steps_clock_logs_each_local_segmentation_training_and_then_lets_go(monkeypatch):
    from fedmedbench.fl.tasks import segmentation as seg

    def fake(model, data, steps, *args, **kwargs):
        return 0.5

    monkeypatch.setattr(seg, "train_steps", fake)
    monkeypatch.setattr(SC.time, "perf_counter", iter([1.0, 3.5, 10.0, 10.2]).__next__)
    logged: list[str] = []
    monkeypatch.setattr(SC, "progress", logged.append)
    with SC.steps_clock() as seconds:
        from fedmedbench.fl.tasks.segmentation import train_steps  # as the methods import it, at call time

        assert train_steps(None, SimpleNamespace(source="site A train"), 100) == 0.5
        train_steps(None, SimpleNamespace(source="sim"), 4)
    assert seconds == pytest.approx([2.5, 0.2])
    assert logged[0] == "local training 1: 100 steps on site A train in 2.5 s (25 ms a step)"
    assert logged[1].startswith("local training 2: 4 steps on sim in 0.2 s (50 ms a step)")
    assert seg.train_steps is fake


def test_ultraflwr_cost_times_real_local_trainings_on_a_stand_in(tmp_path):
    """End to end on the CPU at 64 px: the clock sees every client's 2 epochs in each of 3 rounds, and the
    paper round is the timed round's rest plus 20 epochs of every client scaled to all frames."""
    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    uf = config["ultraflwr"]
    uf["groups"] = {"combined": ["a"]}
    uf["train"]["imgsz"] = 64
    uf["model"]["weights"] = None
    SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)
    row = SC.ultraflwr_cost(config, STUDIES / "ultraflwr.yaml", ["FedAvg"], 3, "cpu", 1, tmp_path / "w",
                            tmp_path / "si", epochs=2, image_cache=str(tmp_path / "frames"))
    assert row["image_cache"] and list((tmp_path / "frames").rglob("*.npy"))  # the frames read from the cache
    parts = row["round_parts"]["combined"]["FedAvg"]
    assert parts["clients"] == 3 and parts["client_epoch_s"] > 0 and parts["client_setup_s"] >= 0
    # the parts are rounded to 1 ms: an epoch's rounding is multiplied by 20 epochs x 3 clients / fraction
    assert parts["train_s"] == pytest.approx(parts["overhead_s"] + 20 * 3 * parts["client_epoch_s"] / row["fraction"],
                                             abs=1e-3 + 20 * 3 * 5e-4 / row["fraction"])
    assert row["local_epochs"] == 20 and row["local_epochs_timed"] == 2 and row["device_hours"] > 0
    # the floor's work: 20 epochs over the clients' training frames at the papers' counts, 3 forward passes each
    manifest = json.loads((tmp_path / "si" / "yolo" / "combined" / "a" / "manifest.json").read_text())
    frames = sum(c["counts"]["train"]["frames"] for c in manifest["clients"])
    assert row["train_samples_per_round"] == pytest.approx(20 * frames / row["fraction"], abs=0.1)
    assert row["flops_per_round"] == pytest.approx(3 * row["forward_flops_per_sample"] * row["train_samples_per_round"])
    assert row["jobs"] == len(uf["strategies"]) * 3 + 3  # and the per-client centralized baseline per seed set


def test_disk_per_job_measures_an_ultraflwr_run_before_and_after_its_working_files_go(tmp_path):
    """bench/disk_per_job.py on a stand-in: the run left its staged links (more entries than frames) before,
    only its results now, and the working files are scaled to all frames by the stand-in's fraction."""
    import disk_per_job

    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    config["ultraflwr"]["groups"] = {"combined": ["a"]}
    SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)
    record = json.loads((tmp_path / "si" / "stand_in.json").read_text())
    frames = sum(sum(v.values()) for v in record["labelled_frames"].values())
    row = disk_per_job.ultraflwr_job(config, tmp_path / "si", 64, 1)
    assert row["work_entries"] > frames and row["entries_left_before"] == row["work_entries"] + 5
    assert row["files_left"] == ["client_metrics.csv", "metrics.csv", "model.pt", "summary.json"]
    assert row["entries_left"] == 4 and row["left_over_model"] <= 1.01 < row["left_over_model_before"]
    freed = row["bytes_left_before"] - row["bytes_left"]
    assert row["work_bytes"] <= freed <= row["work_bytes"] + 65536  # and the work folder's own block
    assert row["at_all_frames"]["work_entries"] == round(row["work_entries"] / record["fraction"])


_TWO_TRAININGS = """
import hashlib, json, pickle, random, sys
import numpy as np, torch
from ultralytics.models.yolo.detect import DetectionTrainer
from fedmedbench.fl.tasks.detection.staging import read_manifest, stage_export
from fedmedbench.fl.tasks.detection.yolo import build_yolo, train_yolo

stage = stage_export(sys.argv[1], sys.argv[2] + "/stage")
classes = len(read_manifest(sys.argv[1])["classes"])
seen, runs, streams = [], [], []
digest = lambda b: hashlib.sha1(b).hexdigest()
preprocess, setup = DetectionTrainer.preprocess_batch, DetectionTrainer._setup_train
DetectionTrainer.preprocess_batch = lambda self, b: seen.append(digest(b["img"].numpy().tobytes())) or preprocess(self, b)

def setup_then_streams(self, *a, **k):  # the streams as the epoch's first batch starts drawing from them
    setup(self, *a, **k)
    streams.append([digest(pickle.dumps(random.getstate())), digest(pickle.dumps(np.random.get_state())),
                    digest(torch.random.get_rng_state().numpy().tobytes())])

DetectionTrainer._setup_train = setup_then_streams
for i in range(2):
    seen.clear()
    out = train_yolo(build_yolo("yolo11n.yaml", classes, seed=3), stage / "client_0" / "data.yaml", epochs=1, batch=8,
                     imgsz=64, seed=1, device=torch.device("cpu"), workdir=sys.argv[2] + f"/w{i}", extra={"close_mosaic": 0})
    runs.append({"streams": streams[-1], "batches": list(seen),
                 "weights": digest(b"".join(v.numpy().tobytes() for v in out.state.values()))})
print(json.dumps(runs))
"""


def test_the_first_local_training_in_a_process_draws_what_a_later_one_draws(tmp_path):
    """A trainer seeds the random streams, then imports Albumentations (and, were they on, Ray Tune's callbacks),
    which reaches ``rich.style``: its first import draws from Python's ``random``. So the first training of a process started
    from other draws than a later one, and a job resumed in a new process trained its first client otherwise than
    the uninterrupted job. In a fresh interpreter, two identical trainings now start their epoch from the same
    streams, see the same batches and end with the same weights."""
    import os
    import subprocess

    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    config["ultraflwr"]["groups"] = {"combined": ["a"]}  # a stand-in's frames show it (the tests' own export does not)
    SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)
    export = tmp_path / "si" / "yolo" / "combined" / "a" / "manifest.json"
    src = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run([sys.executable, "-c", _TWO_TRAININGS, str(export), str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": src})
    assert done.returncode == 0, done.stderr[-3000:]
    first, later = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(first["batches"]) > 1
    assert first["streams"] == later["streams"] and first == later


def test_yolo_read_ahead_bench_times_both_sides_and_finds_the_same_weights(tmp_path, monkeypatch, capsys):
    import yolo_read_ahead

    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    config["ultraflwr"]["groups"] = {"combined": ["a"]}
    SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)
    monkeypatch.setattr(sys, "argv", ["yolo_read_ahead.py", "--surgical-dir", str(tmp_path / "si"), "--epochs", "1",
                                      "--repeats", "1", "--imgsz", "64", "--device", "cpu", "--out", str(tmp_path / "r")])
    yolo_read_ahead.main()
    row = json.loads((tmp_path / "r").read_text())
    assert row["same_weights"] and row["inline_s_per_epoch"] > 0 and row["read_ahead_s_per_epoch"] > 0
    assert row["speedup"] == pytest.approx(row["inline_s_per_epoch"] / row["read_ahead_s_per_epoch"], rel=1e-2)
    assert row["fraction"] == json.loads((tmp_path / "si" / "stand_in.json").read_text())["fraction"]


def test_a_stand_in_replaces_only_an_earlier_stand_in_and_an_unfinished_one_is_named(tmp_path, monkeypatch):
    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "results.csv").write_text("keep me")
    with pytest.raises(SystemExit, match="holds no stand-in"):
        SI.build(config, tmp_path / "mine", 0.01, spec_file=_tiny_spec(tmp_path))
    assert (tmp_path / "mine" / "results.csv").read_text() == "keep me"

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(SI, "export_group", stop)  # a build stopped after the indices
    with pytest.raises(KeyboardInterrupt):
        SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)
    with pytest.raises(SystemExit, match="unfinished stand-in"):
        SC.ultraflwr_cost(config, STUDIES / "ultraflwr.yaml", ["FedAvg"], 3, "cpu", 1, tmp_path / "w", tmp_path / "si")
    monkeypatch.undo()
    SI.build(config, tmp_path / "si", 0.01, spec_file=_tiny_spec(tmp_path), jobs=1, log=lambda m: None)  # replaced
    assert (tmp_path / "si" / "stand_in.json").exists() and not (tmp_path / "si" / SI.BUILDING).exists()


def test_fedst_cost_times_pretraining_first_and_without_weight_files(monkeypatch, tmp_path):
    """The paper config names ImageNet and CLIP weight sets; the timing loads neither (random init and a
    one-hot indicator cost the same), and pre-training is timed before any method."""
    from fedmedbench.studies.fedst import pretrain as PT

    config = grid_cost.load_config(STUDIES / "fedst.yaml")
    assert config["fedst"]["model"]["encoder_weights"] and config["fedst"]["indicator"]["kind"] == "clip"
    surgical = tmp_path / "si"
    (surgical / "clips").mkdir(parents=True)
    (surgical / "clips" / "sites.json").write_text("{}")
    order = []

    def fake_pretrain(params, seed, out, device, log, loader_workers=0, image_cache=None):
        order.append("pretrain")
        assert params["model"]["encoder_weights"] is None and params["indicator"]["kind"] == "onehot"
        torch.save({"_pretrain_s": 5.0}, out)

    monkeypatch.setattr(PT, "pretrain", fake_pretrain)
    monkeypatch.setattr(SC, "time_spec", lambda spec: order.append(spec.method) or [9.0, 2.0, 2.0, 3.0])
    (tmp_path / "w").mkdir()
    row = SC.fedst_cost(config, STUDIES / "fedst.yaml", ["fedst"], 4, "cpu", 1, tmp_path / "w", surgical)
    assert order == ["pretrain", "fedst"] and row["pretrain_s_per_step"] == 1.0


def test_a_missing_config_is_named(tmp_path):
    with pytest.raises(SystemExit, match="nope.yaml: no such config file"):
        grid_cost.load_config(tmp_path / "nope.yaml")


def test_a_stand_in_refuses_an_out_that_is_a_file_in_one_line(tmp_path):
    """--out naming a file stopped the build in a NotADirectoryError traceback; the file is left as it was."""
    config = grid_cost.load_config(STUDIES / "ultraflwr.yaml")
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match=f"--out {tmp_path / 'notes.txt'}: a file, not a folder"):
        SI.build(config, tmp_path / "notes.txt", 0.01, spec_file=_tiny_spec(tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "keep me"
