"""A ``deploy/...`` target for a run that can never be deployed is refused while the workflow plans, in one line
naming the target (it exported the site folders with rc 0, and only a site reading the spec refused), and the
planning's torch-free reading of ``Method.centralized`` is the classes' own."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import yaml
from helpers import ROOT

from fedmedbench.deploy.deployable import why_not
from fedmedbench.fl.api.method_source import builtin_sources
from fedmedbench.fl.api.registry import METHODS, available_methods

MICRO = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())


def test_planning_reads_centralized_as_the_classes_set_it():
    sources = builtin_sources()
    assert {name for name, s in sources.items() if s.centralized()} == {"centralized", "seg_centralized"}
    assert sorted(sources) == available_methods()
    for name, source in sources.items():
        assert source.centralized() == METHODS[name].centralized, name


def test_a_user_method_inheriting_centralized_is_read_as_centralized(tmp_path):
    from fedmedbench.fl.api.method_source import registered_in

    path = tmp_path / "pooled.py"
    path.write_text("from fedmedbench.fl.methods.centralized import Centralized\n"
                    "from fedmedbench.fl.api import register_method\n\n\n"
                    "@register_method('my_pooled')\nclass MyPooled(Centralized):\n    pass\n")
    assert registered_in(path)["my_pooled"].centralized()


def test_why_not_names_each_reason():
    assert why_not({"method": "fedavg"}, centralized=False) is None
    assert why_not({"method": "centralized"}, centralized=True).startswith("method 'centralized' pools all data")
    assert why_not({"method": "fedst", "method_params": {"site_finetune": 2}}, False).startswith("method_params.site_finetune")
    assert why_not({"method": "fedavg", "client_augmentation": {"mode": "reference"}}, False).startswith("client_augmentation")


def _dry_run(tmp_path, cfg: dict, target: str) -> subprocess.CompletedProcess:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "FEDMEDBENCH_DEBUG"}
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", target, "--configfile", str(tmp_path / "c.yaml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("name,setting,method,augmentation,needle", [
    ("centralized", "dir", "centralized", "none", "method 'centralized' pools all data in one place"),
    ("client_augmentation", "dir", "fedavg", "reference", "client_augmentation reads each training image"),
])
def test_a_dry_run_refuses_a_deploy_target_that_cannot_be_deployed(tmp_path, name, setting, method, augmentation,
                                                                     needle):
    cfg = copy.deepcopy(MICRO)
    cfg["studies"]["micro"]["settings"][setting]["client_augmentation"] = augmentation
    target = f"deploy/micro/breastmnist/{setting}/{method}/seed0"
    proc = _dry_run(tmp_path, cfg, target)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {target}: {needle}"), out[-3000:]
    assert "Traceback" not in out and "export_site_data" not in out  # refused before any job was planned


@pytest.mark.slow
def test_a_dry_run_plans_a_deployable_target(tmp_path):
    target = "deploy/micro/breastmnist/dir/fedavg/seed0"
    proc = _dry_run(tmp_path, copy.deepcopy(MICRO), target)
    assert proc.returncode == 0 and "export_site_data" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
