"""The GPU paths, on a machine with CUDA (skipped elsewhere): device arrays, device-cached client
data, the device average and the metrics computed on the GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_device_arrays import make_spec
from test_gpaf_device_path import GPAF_STUDY_RUNS, breast_spec
from test_metrics import _sklearn

from fedmedbench.fl import engine
from fedmedbench.fl.job import Job
from fedmedbench.fl.registry import weighted_average
from fedmedbench.metrics import grouped_classification_metrics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


EARLYSTOP_METHODS = ["fedavg", "fedprox", "scaffold", "feddyn", "fedsam", "fedspeed", "fedsmoo", "fedgamma", "fedlesam",
                     "fedwmsam"]


@pytest.mark.parametrize("method", EARLYSTOP_METHODS)
def test_engine_keeps_arrays_on_the_gpu_with_the_host_paths_numbers(blood_dir, method):
    logs: list[str] = []
    engine.run(make_spec(blood_dir, method, "gpu-dev", device="cuda"), log=logs.append)
    engine.run(make_spec(blood_dir, method, "gpu-host", device="cuda", device_arrays=False), log=lambda m: None)
    assert any("model arrays stay on cuda" in line for line in logs)
    dev = torch.load(blood_dir / f"run-{method}-gpu-dev" / "model.pt", weights_only=True)
    host = torch.load(blood_dir / f"run-{method}-gpu-host" / "model.pt", weights_only=True)
    # the same arithmetic; only cuDNN's kernel choices may differ between the two runs
    assert all(torch.allclose(dev[k].double(), host[k].double(), rtol=1e-4, atol=1e-5) for k in host)


@pytest.mark.parametrize("method,params", GPAF_STUDY_RUNS)
def test_gpaf_study_methods_keep_arrays_and_data_on_the_gpu_with_the_host_paths_numbers(breast_domains_dir, method, params):
    d, logs = breast_domains_dir, []
    engine.run(breast_spec(d, method, params, "gpu-dev", device="cuda"), log=logs.append)
    engine.run(breast_spec(d, method, params, "gpu-host", device="cuda", device_arrays=False, cache_on_device=False),
               log=lambda m: None)
    assert any("model arrays stay on cuda" in line for line in logs)
    assert Job(breast_spec(d, method, params, "gpu-cache", device="cuda")).client_data(0).train_x.is_cuda
    dev = torch.load(d / f"{method}-gpu-dev" / "model.pt", weights_only=True)
    host = torch.load(d / f"{method}-gpu-host" / "model.pt", weights_only=True)
    # the same arithmetic; only cuDNN's kernel choices may differ between the two runs
    assert all(torch.allclose(dev[k].double(), host[k].double(), rtol=1e-4, atol=1e-5) for k in host)


def test_client_data_is_cached_on_the_gpu(blood_dir):
    job = Job(make_spec(blood_dir, "fedavg", "cache", device="cuda"))
    first = job.client_data(0)
    assert first is job.client_data(0) and first.train_x.is_cuda and first.train_y.is_cuda


def test_the_gpu_average_is_the_numpy_average_bit_for_bit():
    rng = np.random.default_rng(0)
    clients = [{"w": rng.standard_normal((64, 33)).astype(np.float32), "n": rng.integers(0, 9, (3,)).astype(np.int64)}
               for _ in range(10)]
    weights = list(rng.random(10) + 0.1)
    want = weighted_average(clients, weights)
    got = weighted_average([{k: torch.from_numpy(v).cuda() for k, v in c.items()} for c in clients], weights)
    assert all(got[k].is_cuda and got[k].cpu().numpy().tobytes() == want[k].tobytes() for k in want)


@pytest.mark.parametrize("n_classes", [2, 7])
def test_metrics_on_the_gpu_match_sklearn(n_classes):
    rng = np.random.default_rng(n_classes)
    n = 300
    y = rng.integers(0, n_classes, n)
    probs = rng.dirichlet(np.ones(n_classes), n)
    losses = rng.random(n)
    rows = [np.arange(n)] + [np.sort(rng.choice(n, rng.integers(5, 80), replace=False)) for _ in range(10)]
    got = grouped_classification_metrics(y, probs, rows, losses, device="cuda")
    for r, m in zip(rows, got, strict=True):
        for k, v in _sklearn(y[r], probs[r], n_classes).items():
            assert (math.isnan(m[k]) and math.isnan(v)) or abs(m[k] - v) <= 1e-12, (k, m[k], v)
