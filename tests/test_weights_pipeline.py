"""Weight sets in the DAG: fetch_weights feeds every training job of the paper grids, names are checked,
and the rule fetches from a mirror (loopback server) into resources/weights/<name>/ once."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import copy_workflow
from helpers.weight_server import weight_server

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "config" / "studies"
TRAIN_RULES = ("train_federated", "ultraflwr_train", "fedst_train", "fedst_pretrain")


def _dag(cfg_file: Path, cwd: Path = ROOT) -> tuple[dict[str, str], set[tuple[str, str]]]:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--dag", "--configfile", str(cfg_file)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nodes = dict(re.findall(r'^\s*(\d+)\[label = "([^"]*)"', proc.stdout, re.M))
    edges = set(re.findall(r"^\s*(\d+) -> (\d+)", proc.stdout, re.M))
    return nodes, edges


@pytest.mark.slow
@pytest.mark.parametrize("study,sets", [
    ("earlystop", {"convnextv2_nano_fcmae_in22k_in1k"}),
    ("ultraflwr", {"yolo11n_coco"}),
    ("fedst", {"pvt_v2_b0_in1k", "clip_vit_b32_laion2b"}),
])
def test_fetch_weights_feeds_every_training_job_of_the_paper_grids(tmp_path, study, sets):
    cfg = STUDIES / f"{study}.yaml"
    nodes, edges = _dag(cfg)
    fetches = {n: label.split("wname: ")[1] for n, label in nodes.items() if label.startswith("fetch_weights")}
    assert set(fetches.values()) == sets
    feeding = {}
    for src, dst in edges:
        if src in fetches:
            feeding.setdefault(dst, set()).add(fetches[src])
    trains = {n: label for n, label in nodes.items() if label.split("\\n")[0] in TRAIN_RULES}
    assert trains
    for n, label in trains.items():
        if study == "fedst":  # the encoder everywhere, CLIP where the job's indicator is CLIP
            other_indicator = any(f"variant: ind_{k}" in label for k in ("random", "gaussian", "onehot"))
            expected = {"pvt_v2_b0_in1k"} | (set() if other_indicator else {"clip_vit_b32_laion2b"})
        else:
            expected = sets
        assert feeding.get(n, set()) == expected, label


@pytest.mark.slow
def test_unknown_weight_set_and_double_source_are_named(tmp_path):
    base = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())
    for model, needle in (({"weights": "imagenet_nope"}, "studies.micro.model.weights"),
                          ({"weights": "swin_tiny_in1k", "pretrained_path": "x.pt"}, "studies.micro.model.weights")):
        cfg = copy.deepcopy(base)
        cfg["studies"]["micro"]["model"] = {**cfg["studies"]["micro"].get("model", {}), **model}
        f = tmp_path / "cfg.yaml"
        f.write_text(yaml.safe_dump(cfg))
        proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "--configfile", str(f)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and needle in proc.stdout + proc.stderr


@pytest.mark.slow
def test_fetch_weights_rule_fetches_from_a_mirror_once(tmp_path):
    import hashlib

    import safetensors.torch
    import torch

    body = safetensors.torch.save({"w": torch.arange(6.0).reshape(2, 3)})
    wf = copy_workflow(tmp_path / "wf")
    cfg = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())
    with weight_server() as server:
        server.serve("/org/tiny/resolve/v1/model.safetensors", body)
        cfg["weights"] = {"tiny": {"source": "hf_hub", "repo_id": "org/tiny", "filename": "model.safetensors",
                                   "revision": "v1", "base_url": server.url,
                                   "sha256": hashlib.sha256(body).hexdigest(), "licence": "test"}}
        (wf / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        target = "resources/weights/tiny/manifest.json"
        cmd = [sys.executable, "-m", "snakemake", target, "--cores", "1", "--configfile", "cfg.yaml"]
        proc = subprocess.run(cmd, cwd=wf, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (wf / "resources/weights/tiny/model.safetensors").read_bytes() == body
        manifest = yaml.safe_load((wf / target).read_text())
        assert manifest["sha256"] == hashlib.sha256(body).hexdigest() and manifest["licence"] == "test"
        # a mirror change is not a new weight set: nothing reruns, nothing is downloaded again
        cfg["weights"]["tiny"]["base_url"] = "http://127.0.0.1:9"
        (wf / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        again = subprocess.run([*cmd, "-n"], cwd=wf, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
        assert server.hits == {"/org/tiny/resolve/v1/model.safetensors": 1}
