"""The demo shows the methods differ: centralized > FedAvg IID > FedAvg Dirichlet 0.1 on the quickstart slice.

Runs the demo config's own quickstart label-skew slice (its data settings, seeds, rounds and
training; only the domain and center settings and the `local` method are left out) through
Snakemake and checks the ordering of the final-round test accuracy, mean over the demo's seeds.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from helpers import ROOT, copy_workflow

DEMO = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
MARGIN = 0.03  # accuracy points (as fractions) each step of the ordering must clear


def ordering_slice(demo: dict) -> dict:
    """The quickstart study's IID and Dirichlet 0.1 settings with FedAvg and centralized, as the demo runs them."""
    study = copy.deepcopy(demo["studies"]["quickstart"])
    study["settings"] = {k: study["settings"][k] for k in ("iid", "dir0.1")}
    study["datasets"] = sorted({d for s in study["settings"].values() for d in s.get("datasets", study["datasets"])})
    study["methods"] = ["fedavg", "centralized"]
    return {"device": "cpu", "data": copy.deepcopy(demo["data"]), "threads": demo["threads"], "studies": {"quickstart": study}}


def test_slice_is_the_demo_slice():
    cfg = ordering_slice(DEMO)["studies"]["quickstart"]
    demo = DEMO["studies"]["quickstart"]
    assert cfg["settings"]["dir0.1"]["params"]["alpha"] == 0.1 and cfg["settings"]["iid"]["scheme"] == "iid"
    assert cfg["train"] == demo["train"] and cfg["seeds"] == demo["seeds"] and set(cfg["methods"]) <= set(demo["methods"])


@pytest.mark.slow
def test_centralized_beats_fedavg_iid_beats_fedavg_dir01(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    (work / "slice.yaml").write_text(yaml.safe_dump(ordering_slice(DEMO)))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "slice.yaml"], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_csv(work / "results" / "quickstart" / "tables" / "final_metrics_synthetic.csv")
    acc = table.set_index(["setting", "method"])["global_accuracy_mean"]
    central, iid, skew = acc[("iid", "centralized")], acc[("iid", "fedavg")], acc[("dir0.1", "fedavg")]
    assert central > iid + MARGIN > skew + 2 * MARGIN, f"centralized {central:.3f}, FedAvg IID {iid:.3f}, FedAvg dir0.1 {skew:.3f}"
    assert central < 0.98, f"centralized saturates ({central:.3f}): the synthetic data are too easy to show differences"
