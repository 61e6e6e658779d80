"""``engine.deterministic``: a job asks torch, cuDNN and cuBLAS for deterministic kernels; runtime only.
(That it makes a GPU rerun the same bits is checked on a GPU: ``tests/test_cuda.py``.)"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import yaml
from snakemake.utils import validate
from test_config import MICRO, SCHEMA
from test_device_arrays import make_spec

from fedmedbench.fl import engine
from fedmedbench.fl.determinism import CUBLAS_WORKSPACE_CONFIG
from fedmedbench.fl.job import Job
from fedmedbench.fl.spec import RunSpec, for_job, result_params


@pytest.fixture
def torch_flags(monkeypatch):
    """Restores the process-wide flags a deterministic job sets."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


def _flags() -> tuple:
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


def test_a_deterministic_job_asks_for_deterministic_kernels(blood_dir, torch_flags):
    Job(make_spec(blood_dir, "fedavg", "det", deterministic=True))
    assert _flags() == (True, True, True, False, CUBLAS_WORKSPACE_CONFIG)


def test_a_job_without_it_leaves_the_process_flags_alone(blood_dir, torch_flags):
    Job(make_spec(blood_dir, "fedavg", "nondet"))
    assert _flags() == (False, False, False, True, None)


def test_on_the_cpu_it_changes_no_bit(blood_dir, torch_flags):
    engine.run(make_spec(blood_dir, "fedsam", "plain"), log=lambda m: None)
    engine.run(make_spec(blood_dir, "fedsam", "det", deterministic=True), log=lambda m: None)
    plain, det = (torch.load(blood_dir / f"run-fedsam-{t}" / "model.pt", weights_only=True) for t in ("plain", "det"))
    assert plain.keys() == det.keys() and all(torch.equal(plain[k], det[k]) for k in plain)


def test_a_workspace_setting_of_the_user_is_kept(blood_dir, torch_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    Job(make_spec(blood_dir, "fedavg", "det", deterministic=True))
    assert _flags()[-1] == ":16:8"


def test_it_is_a_runtime_option_outside_the_run_hash(blood_dir):
    spec = make_spec(blood_dir, "fedavg", "h")
    on = RunSpec.from_dict({**spec.to_dict(), "deterministic": True})
    assert on.run_hash() == spec.run_hash()  # a finished job is not rerun, a checkpoint is resumed
    assert "deterministic" not in result_params(on.to_dict())  # not in the rule's params either
    cfg = copy.deepcopy(MICRO)
    cfg["engine"] = {"deterministic": True}
    validate(cfg, SCHEMA)
    assert for_job(spec.to_dict(), 2, cfg).deterministic is True
    validate(plain := copy.deepcopy(MICRO), SCHEMA)
    assert plain["engine"]["deterministic"] is False and for_job(spec.to_dict(), 2, plain).deterministic is False


def test_the_schema_rejects_a_non_boolean():
    cfg = copy.deepcopy(MICRO)
    cfg["engine"] = {"deterministic": "yes"}
    with pytest.raises(Exception, match="deterministic"):
        validate(cfg, SCHEMA)


def test_the_demo_config_leaves_it_off():
    cfg = yaml.safe_load(Path(SCHEMA).with_name("config.yaml").read_text())
    validate(cfg, SCHEMA)
    assert cfg["engine"]["deterministic"] is False
