"""The surgical rules: config schema and cross-field checks, the synthetic slice end to end, exact reruns,
and the error for a missing licensed dataset."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import copy_workflow, schema_error
from snakemake.utils import validate

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = str(ROOT / "config" / "schema.yaml")
MICRO = yaml.safe_load((ROOT / "tests" / "fixtures" / "surgical_micro.yaml").read_text())
SURG = "resources/surgical/synthetic"
TARGETS = [f"{SURG}/groups/combined", f"{SURG}/yolo/combined", f"{SURG}/clips"]


def snakemake(workdir: Path, *args: str, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, capture_output=True, text=True,
                          timeout=timeout)


def _write(workdir: Path, cfg: dict, name="cfg.yaml") -> str:
    (workdir / name).write_text(yaml.safe_dump(cfg))
    return name


def test_demo_config_validates_and_fills_surgical_defaults():
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(cfg, SCHEMA)
    s = cfg["surgical"]
    assert s["clips"]["tolerance_s"] == 0.1 and s["datasets"]["m2cai16"]["box_tolerance_px"] == 1.0
    assert s["groups"]["track20"]["frame_step"] == {} and s["groups"]["track20"]["pool_from"] is None
    assert s["sites"]["A"]["role"] == "federated"
    minimal = {"studies": copy.deepcopy(MICRO["studies"])}
    validate(minimal, SCHEMA)
    assert minimal["surgical"]["groups"] == {} and minimal["surgical"]["bad_files"] == "fail"
    assert minimal["surgical"]["tool_groups"] == {"energy": ["bipolar", "hook"], "cold": ["grasper", "scissors"]}


@pytest.mark.parametrize("path,value,needle", [
    (["surgical", "bad_files"], "ignore", "'ignore' is not one of"),
    (["surgical", "datasets", "m2cai16", "layout"], "pascal", "'pascal' is not one of"),
    (["surgical", "groups", "combined", "settings", "a", "scheme"], "random", "'random' is not one of"),
    (["surgical", "groups", "combined", "settings", "c"], {"scheme": "lmo"}, "'base' is a required property"),
    (["surgical", "sites", "A", "role"], "spectator", "'spectator' is not one of"),
])
def test_surgical_schema_errors_name_the_key(path, value, needle):
    assert needle in schema_error(MICRO, path, value, SCHEMA)


@pytest.mark.parametrize("mutate,needle", [
    (lambda s: s["groups"]["combined"].__setitem__("datasets", ["m2cai16", "cholec80"]), "surgical.datasets"),
    (lambda s: s["groups"]["combined"]["settings"]["c"].__setitem__("base", "zz"), "surgical.groups.combined.settings.c.base"),
    (lambda s: s["groups"]["combined"]["settings"]["c"].__setitem__("client_classes", ["all", "laser", "cold"]),
     "surgical.groups.combined.settings.c.client_classes"),
    (lambda s: s.__setitem__("origin", "real"), "surgical.root"),
    (lambda s: s["synthetic"]["datasets"].pop("lobyt"), "surgical.synthetic.datasets"),
])
def test_surgical_cross_field_errors(tmp_path, mutate, needle):
    cfg = copy.deepcopy(MICRO)
    mutate(cfg["surgical"])
    proc = snakemake(ROOT, "-n", "--quiet", "--configfile", str(tmp_path / _write(tmp_path, cfg)))
    assert proc.returncode != 0 and needle in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    work = tmp_path_factory.mktemp("surgical_pipeline")
    copy_workflow(work)
    name = _write(work, MICRO)
    start = time.time()
    proc = snakemake(work, *TARGETS, "--cores", "2", "--configfile", name)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (work / "wall_s.txt").write_text(f"{time.time() - start:.1f}\n")
    return work


@pytest.mark.slow
def test_synthetic_slice_builds_every_output(pipeline_dir):
    raw = pipeline_dir / "resources/surgical/synthetic/raw"
    assert (raw / "m2cai16-tool-locations" / "ImageSets" / "Main" / "train.txt").is_file()
    assert (raw / "CholecTrack20" / "Training" / "VID02" / "VID02.json").is_file()
    assert (raw / "EndoVis2017" / "train" / "instrument_dataset_1" / "ground_truth").is_dir()
    for setting in ("a", "b", "c"):
        sdir = pipeline_dir / SURG / "groups" / "combined" / setting
        assert (sdir / "stats.csv").is_file() and (sdir / "distribution_synthetic.png").stat().st_size > 5000
        for k in range(3):
            data = yaml.safe_load((pipeline_dir / SURG / "yolo" / "combined" / setting / f"client_{k}" / "data.yaml").read_text())
            assert Path(data["path"], data["train"]).is_dir()
    site_e = json.loads((pipeline_dir / SURG / "clips" / "E" / "site.json").read_text())
    assert site_e["role"] == "out_of_federation" and set(site_e["counts"]) == {"test"}
    clips = pd.read_parquet(pipeline_dir / SURG / "clips" / "A" / "clips.parquet")
    assert set(clips["split"]) == {"train", "test"} and (clips["n_duplicated"] < 3).any()
    for log in ("logs/synthesize_surgical.log", "logs/recurate_videos/synthetic/combined.log"):
        assert (pipeline_dir / log).stat().st_size > 0


@pytest.mark.slow
def test_rerun_touches_only_what_changed(pipeline_dir):
    proc = snakemake(pipeline_dir, *TARGETS, "-n", "--configfile", "cfg.yaml")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr
    cfg = copy.deepcopy(MICRO)
    cfg["surgical"]["clips"] = {"interval_s": 0.4}
    proc = snakemake(pipeline_dir, *TARGETS, "-n", "--configfile", _write(pipeline_dir, cfg, "c2.yaml"))
    out = proc.stdout + proc.stderr
    assert "export_clips" in out and "recurate_videos" not in out and "index_surgical" not in out, out[-2000:]
    cfg = copy.deepcopy(MICRO)
    cfg["surgical"]["groups"]["combined"]["seed"] = 5
    proc = snakemake(pipeline_dir, *TARGETS, "-n", "--configfile", _write(pipeline_dir, cfg, "c3.yaml"))
    out = proc.stdout + proc.stderr
    assert "recurate_videos" in out and "export_yolo" in out and "index_surgical" not in out and "export_clips" not in out


@pytest.mark.slow
def test_missing_real_dataset_fails_with_a_clear_message(pipeline_dir, tmp_path):
    cfg = copy.deepcopy(MICRO)
    cfg["surgical"]["origin"] = "real"
    cfg["surgical"]["root"] = str(tmp_path / "licensed")
    proc = snakemake(pipeline_dir, "resources/surgical/real/index/cholectrack20", "--cores", "1", "--configfile",
                     _write(pipeline_dir, cfg, "real.yaml"))
    assert proc.returncode != 0
    log = (pipeline_dir / "logs" / "index_surgical" / "real" / "cholectrack20.log").read_text()
    assert "surgical dataset 'cholectrack20' not found" in log and str(tmp_path / "licensed" / "CholecTrack20") in log
    assert not (pipeline_dir / "resources" / "surgical" / "real" / "index" / "cholectrack20").exists()
