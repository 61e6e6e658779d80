"""The demo's UltraFlwr slice measures something: with the demo config's synthetic videos and training
settings, a short centralized run (client 0 of G_combined-a, rounds x epochs epochs, as the demo's
centralized baseline) reaches a validation mAP50 above 0. If a change to the synthetic videos or the
demo's settings leaves the demo learning nothing (all tables 0, Figure 3 flat), this fails."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_cfg():
    from snakemake.utils import validate

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(cfg, str(ROOT / "config" / "schema.yaml"))  # fills the schema's defaults
    return cfg


def test_demo_slice_reaches_nonzero_map50(demo_cfg, tmp_path):
    from fedmedbench.data.surgical import recurate as R
    from fedmedbench.data.surgical import synthetic_layouts as SL
    from fedmedbench.data.surgical.export_yolo import export_group
    from fedmedbench.data.surgical.group_io import write_group
    from fedmedbench.data.surgical.index import build_index
    from fedmedbench.data.surgical.schema import read_index
    from fedmedbench.fl.tasks.detection.staging import stage_export
    from fedmedbench.fl.tasks.detection.yolo import build_yolo, train_yolo

    surg, uf = demo_cfg["surgical"], demo_cfg["ultraflwr"]
    group_name, settings = next(iter(uf["groups"].items()))
    group_cfg = copy.deepcopy(surg["groups"][group_name])
    syn = surg["synthetic"]
    indices, metas = {}, {}
    for name in group_cfg["datasets"]:
        dcfg = {**surg["datasets"][name], "bad_files": "fail"}
        SL.generate(name, dcfg, syn["datasets"][name], syn["seed"], syn["width"], syn["height"],
                    tmp_path / "raw" / dcfg["folder"])
        build_index(name, dcfg, tmp_path / "raw", tmp_path / f"idx_{name}", log=lambda m: None)
        indices[name], metas[name] = read_index(tmp_path / f"idx_{name}")
    group = R.build_group(group_name, indices, metas, group_cfg, surg["tool_groups"])
    write_group(group, tmp_path / "group", "synthetic")
    export_group(tmp_path / "group", tmp_path / "yolo")
    stage = stage_export(tmp_path / "yolo" / settings[0] / "manifest.json", tmp_path / "stage")

    t = uf["train"]
    model = build_yolo(uf["model"]["cfg"], len(group.classes), seed=0)
    out = train_yolo(model, stage / "client_0" / "data.yaml", epochs=t["rounds"] * t["epochs"], batch=t["batch"],
                     imgsz=t["imgsz"], seed=0, device=torch.device("cpu"), workdir=tmp_path / "w",
                     extra={"lr0": t["lr0"], "patience": t["patience"], **t["ultralytics"]})
    assert max(out.val_map50) > 0, f"validation mAP50 per epoch {out.val_map50}: the demo learns nothing"
