"""`make check`: the outputs a config's DAG names that are missing, by folder, where `snakemake -n` sees nothing to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import copy_workflow

from fedmedbench.workflow import check_outputs as C

RUN = "results/s/breastmnist/iid/fedavg/seed0"
SUMMARY = "\n".join([
    "output_file\tdate\trule\tlog-file(s)\tstatus\tplan",
    "results/s/tables/final_metrics.csv\tSun Nov 29 07:16:01 2026\taggregate_results\t-\tok\tno update",
    f"{RUN}/metrics.csv\tSun Nov 29 07:16:01 2026\ttrain_federated\t-\tok\tno update",
    f"{RUN}/model.pt\t-\ttrain_federated\t-\tmissing\tno update",
    "results/s/breastmnist/iid/local/seed0/metrics.csv\t-\ttrain_federated\t-\tmissing\tno update",
    "results/s/breastmnist/iid/local/seed0/model.pt\t-\ttrain_federated\t-\tmissing\tno update",
])


def test_missing_outputs_are_listed_by_folder_with_their_rule():
    outputs = C.parse_summary("Building DAG of jobs...\n" + SUMMARY)
    assert [o.status for o in outputs] == ["ok", "ok", "missing", "missing", "missing"]
    lines, status = C.report(outputs, ["c.yaml"])
    assert status == 1
    assert lines[:2] == [f"{RUN} (train_federated): model.pt missing",
                         "results/s/breastmnist/iid/local/seed0 (train_federated): metrics.csv, model.pt missing"]
    assert lines[2].startswith("3 of 5 outputs missing in 2 folder(s)")
    assert lines[2].endswith(f"snakemake --configfile c.yaml -- {RUN}/model.pt")
    lines, status = C.report([o for o in outputs if o.status == "ok"], [])
    assert (lines, status) == (["all 2 outputs are present"], 0)
    with pytest.raises(ValueError, match="printed no table"):
        C.parse_summary("Building DAG of jobs...\n")


@pytest.mark.slow
def test_a_deleted_model_and_run_folder_are_listed_where_snakemake_sees_nothing_to_do(tmp_path):
    """Every output of a small config present (written empty, all with one time), then a finished run's model.pt
    and another run's whole folder deleted: `snakemake -n` has nothing to do; the check lists both."""
    work = copy_workflow(tmp_path / "wf")
    cfg = {"device": "cpu", "data": {"origin": "synthetic"},
           "studies": {"s": {"datasets": ["breastmnist"], "seeds": [0], "methods": ["fedavg", "local"],
                             "settings": {"iid": {"scheme": "iid", "num_clients": 2}}, "train": {"rounds": 1}}}}
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    outputs = C.summary(["c.yaml"], cwd=work)
    assert {o.status for o in outputs} == {"missing"} and f"{RUN}/model.pt" in {o.path for o in outputs}
    for out in outputs:
        path = work / out.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        os.utime(path, (1_700_000_000, 1_700_000_000))
    assert C.report(C.summary(["c.yaml"], cwd=work), ["c.yaml"]) == ([f"all {len(outputs)} outputs are present"], 0)
    (work / RUN / "model.pt").unlink()
    for name in ("metrics.csv", "client_metrics.csv", "summary.json", "model.pt"):
        (work / "results/s/breastmnist/iid/local/seed0" / name).unlink()
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", "c.yaml", "--rerun-triggers", "mtime"],
                         cwd=work, capture_output=True, text=True, timeout=300)
    assert "Nothing to be done" in dry.stdout + dry.stderr  # what Snakemake says (the empty files have no record)
    proc = subprocess.run([sys.executable, "-m", "fedmedbench.workflow.check_outputs", "--configfile", "c.yaml"],
                          cwd=work, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(work / "src")})
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[:2] == [
        f"{RUN} (train_federated): model.pt missing",
        "results/s/breastmnist/iid/local/seed0 (train_federated): metrics.csv, client_metrics.csv, summary.json, "
        "model.pt missing"]


def test_make_check_calls_it_with_the_config():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "\t$(BIN)/python -m fedmedbench.workflow.check_outputs $(if $(CONFIG),--configfile $(CONFIG))" in makefile
