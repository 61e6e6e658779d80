"""The GPU paths, on a machine with CUDA (skipped elsewhere): device arrays, device-cached client
data, the device average and the metrics computed on the GPU, and ``engine.deterministic``.

The runs compared here ask for deterministic kernels (``engine.deterministic``). Without them, kernels
that are not run-to-run deterministic (cuDNN's convolution backward may be one) can make two runs of the
same arithmetic differ in the last bits, and a few rounds of Adam (the GPAF study) or of FedDyn, FedSpeed
and FedGAMMA amplify that: on the H100 those comparisons, with a tolerance of 1e-4 and no deterministic
kernels, failed, centralized's too, whose two runs do the same operations on the same device."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from helpers import Killed, kill_after_round
from test_device_arrays import make_spec, numpy_average
from test_gpaf_device_path import GPAF_STUDY_RUNS, breast_spec
from test_metrics import _sklearn

from fedmedbench.fl.api.arrays import weighted_average
from fedmedbench.fl.determinism import CUBLAS_WORKSPACE_CONFIG
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine import job as job_module
from fedmedbench.fl.engine.job import Job
from fedmedbench.fl.methods._sgd import div
from fedmedbench.metrics.classification import grouped_classification_metrics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# cuBLAS reads its workspace setting when the process first uses it: before any test here runs
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)


def _load(run_dir) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def _differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str:
    """The entries that differ and by how much (the assertion's message: what a failure looked like)."""
    diff = {k: float((a[k].double() - b[k].double()).abs().max()) for k in b if not torch.equal(a[k], b[k])}
    worst = sorted(diff.items(), key=lambda kv: -kv[1])[:5]
    return f"{len(diff)} of {len(b)} entries differ; largest: {worst}"


EARLYSTOP_METHODS = ["fedavg", "fedprox", "scaffold", "feddyn", "fedsam", "fedspeed", "fedsmoo", "fedgamma", "fedlesam",
                     "fedwmsam"]


@pytest.mark.parametrize("method", EARLYSTOP_METHODS)
def test_engine_keeps_arrays_on_the_gpu_with_the_host_paths_numbers(blood_dir, monkeypatch, method):
    # gpaf_cnn (convolutions, batch norm, linear layers) has a deterministic CUDA kernel for every step; cnn_small's
    # adaptive average pooling backward has none (it adds with atomics), so its runs differ even so
    logs: list[str] = []
    engine.run(make_spec(blood_dir, method, "gpu-dev", device="cuda", deterministic=True, model="gpaf_cnn"),
               log=logs.append)
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ())  # the arrays on the host (as with Ray actors)
    engine.run(make_spec(blood_dir, method, "gpu-host", device="cuda", deterministic=True, model="gpaf_cnn"),
               log=lambda m: None)
    assert any("model arrays stay on cuda" in line for line in logs)
    dev, host = _load(blood_dir / f"run-{method}-gpu-dev"), _load(blood_dir / f"run-{method}-gpu-host")
    # the same kernels for training; the server's float64 arithmetic runs on the GPU on one path and on the CPU on
    # the other, where a reduction (FedSMOO's and FedWMSAM's norms) may round its last bit differently
    assert all(torch.allclose(dev[k].double(), host[k].double(), rtol=1e-4, atol=1e-5) for k in host), \
        _differences(dev, host)


@pytest.mark.parametrize("method,params", GPAF_STUDY_RUNS)
def test_gpaf_study_methods_keep_arrays_and_data_on_the_gpu_with_the_host_paths_numbers(breast_domains_dir, monkeypatch,
                                                                                         method, params):
    d, logs = breast_domains_dir, []
    engine.run(breast_spec(d, method, params, "gpu-dev", device="cuda", deterministic=True), log=logs.append)
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ())  # the arrays on the host (as with Ray actors)
    engine.run(breast_spec(d, method, params, "gpu-host", device="cuda", cache_on_device=False, deterministic=True),
               log=lambda m: None)
    assert any("model arrays stay on cuda" in line for line in logs)
    assert Job(breast_spec(d, method, params, "gpu-cache", device="cuda")).client_data(0).train_x.is_cuda
    dev, host = _load(d / f"{method}-gpu-dev"), _load(d / f"{method}-gpu-host")
    # the same kernels on the same device, and no server arithmetic that the two paths do on different devices
    # (the average is the same bits on the GPU: test_the_gpu_average_is_the_numpy_average_bit_for_bit)
    assert host.keys() == dev.keys() and all(torch.equal(dev[k], host[k]) for k in host), _differences(dev, host)


@pytest.mark.parametrize("method,params", [("gpaf", {"server_epochs": 2}), ("centralized", {})])
def test_deterministic_kernels_make_a_gpu_rerun_and_a_resumed_run_the_same_bits(breast_domains_dir, monkeypatch,
                                                                                 method, params):
    d = breast_domains_dir
    for tag in ("det-a", "det-b"):
        engine.run(breast_spec(d, method, params, tag, device="cuda", deterministic=True), log=lambda m: None)
    revive = kill_after_round(monkeypatch, 1)
    with pytest.raises(Killed):
        engine.run(breast_spec(d, method, params, "det-k", device="cuda", deterministic=True), log=lambda m: None)
    revive()
    logs: list[str] = []
    engine.run(breast_spec(d, method, params, "det-k", device="cuda", deterministic=True), log=logs.append)
    assert any("resuming from checkpoint at round 1/2" in line for line in logs)
    first = _load(d / f"{method}-det-a")
    for tag in ("det-b", "det-k"):
        again = _load(d / f"{method}-{tag}")
        assert all(torch.equal(first[k], again[k]) for k in first), (tag, _differences(again, first))


def test_client_data_is_cached_on_the_gpu(blood_dir):
    job = Job(make_spec(blood_dir, "fedavg", "cache", device="cuda"))
    first = job.client_data(0)
    assert first is job.client_data(0) and first.train_x.is_cuda and first.train_y.is_cuda


def test_the_gpu_average_is_the_numpy_average_bit_for_bit():
    rng = np.random.default_rng(0)
    clients = [{"w": rng.standard_normal((64, 33)).astype(np.float32), "n": rng.integers(0, 9, (3,)).astype(np.int64)}
               for _ in range(10)]
    weights = list(rng.random(10) + 0.1)
    want = numpy_average(clients, weights)
    got = weighted_average([{k: torch.from_numpy(v).cuda() for k, v in c.items()} for c in clients], weights)
    assert all(got[k].is_cuda and got[k].cpu().numpy().tobytes() == want[k].tobytes() for k in want)
    host = weighted_average([{k: torch.from_numpy(v) for k, v in c.items()} for c in clients], weights)
    assert all(host[k].numpy().tobytes() == want[k].tobytes() for k in want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("divisor", [0.0037, 7, "tensor"])
def test_division_on_the_gpu_is_numpys_quotient_bit_for_bit(dtype, divisor):
    """CUDA divides by a number as a multiplication by its reciprocal (a quarter of float32 quotients differ
    in the last bit); ``_sgd.div`` must give the CPU's and NumPy's quotients, as the host path computes them."""
    rng = np.random.default_rng(0)
    host = {k: rng.standard_normal(n).astype(np.float32 if dtype == torch.float32 else np.float64)
            for k, n in (("w", 4096), ("b", 33))}
    b = torch.tensor(0.37, dtype=torch.float64) if divisor == "tensor" else divisor
    got = div({k: torch.from_numpy(v).cuda() for k, v in host.items()}, b)
    want = {k: v / v.dtype.type(float(b)) for k, v in host.items()}
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


def _syncs(fn) -> int:
    """Calls in ``fn()`` that made the host wait for the GPU (torch.cuda's sync debug mode, as warnings)."""
    import warnings

    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    return sum("synchroniz" in str(w.message) for w in caught)


def _waits(make, sizes=(2, 6)) -> list[int]:
    """The host's waits for the GPU in ``make(n)()`` for each of ``sizes`` (``make(n)`` sets up, uncounted, and returns
    what is counted), after one uncounted ``make(sizes[0])()``: the first client a process counted waited once more
    than the later ones (on an H200: 10 waits for 2 steps, 9 for 6), set-up rather than a wait per step."""
    make(sizes[0])()
    return [_syncs(make(n)) for n in sizes]


def _on_gpu(data):
    from dataclasses import fields, replace

    return replace(data, **{f.name: getattr(data, f.name).cuda() for f in fields(data)
                            if getattr(data, f.name) is not None})  # augmentation sources: None unless asked for


@pytest.mark.parametrize("method", EARLYSTOP_METHODS)
def test_an_earlystop_client_on_gpu_data_does_not_wait_for_the_gpu_per_step(method):
    """With the client's data on the GPU (engine.cache_on_device) a step queues its kernels without waiting for
    the last step's: the host waits as often for 2 steps as for 6 (a CPU batch index into GPU data waited per step)."""
    from dataclasses import replace

    from test_methods import context, tiny_data, tiny_model

    from fedmedbench.fl.api.registry import get_method

    def fit(steps: int):
        model = tiny_model()
        broadcast = {"last_update": {n: np.full(p.shape, 0.01, np.float32) for n, p in model.named_parameters()}}
        ctx = replace(context(model=model, steps=steps, broadcast=broadcast if method == "fedlesam" else None,
                              data=_on_gpu(tiny_data(n=48))), device=torch.device("cuda"))
        return lambda: get_method(method, {}).client_fit(ctx)

    counts = _waits(fit)
    # a wait per step would add 4 for 6 steps; a one-off (the process's first pinned copy) may fall in either count
    assert counts[1] <= counts[0], f"{method}: the host waited {counts[0]} times for 2 steps, {counts[1]} for 6"


@pytest.mark.parametrize("name", ["gpaf", "moon", "feddg", "centralized"])
def test_a_gpaf_study_client_on_gpu_data_does_not_wait_for_the_gpu_per_step(name):
    from dataclasses import replace

    from helpers.clients import client_ctx, fresh_global, toy_data, toy_spec, train_config

    from fedmedbench.fl.api.registry import get_method

    method = get_method(name, {"server_epochs": 1} if name == "gpaf" else {})
    spec, cfg = toy_spec("moon" if name == "centralized" else name), train_config(grad_clip=1.0)
    arrays, data = fresh_global(method, spec), _on_gpu(toy_data(48))
    counts = []
    for steps in (2, 6):
        state: dict = {}
        first = client_ctx(method, spec, arrays, data, steps=1, state=state, cfg=cfg)
        method.client_fit(replace(first, device=torch.device("cuda")))
        ctx = replace(client_ctx(method, spec, arrays, data, rnd=2, steps=steps, state=state, cfg=cfg),
                      device=torch.device("cuda"))  # MOON: l_con on
        counts.append(_syncs(lambda c=ctx: method.client_fit(c)))
    assert counts[0] == counts[1], f"{name}: the host waited {counts[0]} times for 2 steps, {counts[1]} for 6"


def test_an_evaluation_waits_for_the_gpu_once_not_per_batch():
    from fedmedbench.fl.training import predict_samples

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)).cuda()
    x, y = torch.randint(0, 256, (60, 1, 2, 2), dtype=torch.uint8), torch.randint(0, 3, (60,))
    counts = _waits(lambda b: lambda: predict_samples(model, x, y, b, torch.device("cuda")), sizes=(30, 10))
    assert counts[0] == counts[1], f"the host waited {counts[0]} times for 2 batches, {counts[1]} for 6"


def test_a_segmentation_site_does_not_wait_for_the_gpu_per_step(tmp_path):
    """fedst's local steps copy each batch and the augmentation's grid from pinned memory without waiting."""
    from test_fedst_data import _frames_on_disk, _LastFrame

    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.tasks import segmentation as seg

    clips = []
    for c in range(4):
        d = tmp_path / f"c{c}"
        d.mkdir()
        clips.append(_frames_on_disk(d, ["a.png", "a.png", "b.png"], h=24, w=32))
    data = seg.ClipSet([c[0] for c in clips], [c[1] for c in clips], "site", (12, 16), seg.FrameCache(10**8))
    data.batch(range(4))  # every clip decoded: the steps read the cache
    train = TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1, optimizer="adamw")
    model = _LastFrame().cuda()
    counts = _waits(lambda s: lambda: seg.train_steps(model, data, s, train, 0.1, torch.device("cuda"),
                                                      torch.Generator().manual_seed(4), {"augment": True}))
    # a wait per step would add 4 for 6 steps; a one-off (on an H200: 2 waits for 2 steps, 1 for 6) may fall in either
    assert counts[1] <= counts[0], f"the host waited {counts[0]} times for 2 steps, {counts[1]} for 6"


def test_segmentation_scores_on_the_gpu_are_medpys():
    """fedst's frame scores computed with torch on the GPU (``eval.metrics_device``) against MedPy's on the CPU:
    Dice, IoU and HD95 to the bit, ASSD within 1e-12 relative, on blobs, scattered labels and anisotropic spacing."""
    from test_segmetrics_device import PARTS, assert_same, blobs

    from fedmedbench.metrics import segmentation as S
    from fedmedbench.metrics.segmentation_device import batch_scores

    rng = np.random.default_rng(0)
    pred, gt = blobs(rng, 4, (96, 120)), blobs(rng, 4, (96, 120))
    scattered = rng.random((96, 120)) < 0.1
    pred[1][scattered] = rng.integers(0, 4, int(scattered.sum()))
    gt[2] = np.where(gt[2] == 3, 0, gt[2])
    spacing = [None, (2.0, 0.5), None, (1.3, 1.7)]
    for assd in S.ASSD_RULES:
        got = batch_scores(torch.as_tensor(pred, device="cuda"), torch.as_tensor(gt, device="cuda"), list(PARTS), assd,
                           spacing)
        for f in range(len(pred)):
            want = S.frame_scores(pred[f], gt[f], list(PARTS), assd, spacing[f])
            for c in PARTS:
                assert_same(got[f].scores[c], want[c], f"frame {f} class {c} {assd}")


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedsam"])
def test_clients_together_on_the_gpu_equal_one_by_one(tmp_path, method):
    """train.batch_clients on CUDA: the same weights as one by one on CUDA, to float32 rounding."""
    from test_clients_together import ATOL, RTOL, run, spec, write_data

    d = write_data(tmp_path, 28, 200)
    params = {"rho": 0.05} if method == "fedsam" else {}
    one = run(spec(d, "one", method, params=params, device="cuda", deterministic=True))
    both = run(spec(d, "both", method, params=params, batch_clients=True, device="cuda", deterministic=True))
    for k, a in one.arrays.items():
        torch.testing.assert_close(torch.as_tensor(both.arrays[k]).cpu(), torch.as_tensor(a).cpu(),
                                   atol=ATOL * 10, rtol=RTOL, msg=k)


def test_seeds_side_by_side_on_the_gpu_equal_each_alone(tmp_path):
    """train.seeds_together on CUDA: two seeds side by side (their clients trained, their global models evaluated
    in shared calls, each run's CUDA generator put back) end on the weights and metrics of each run alone."""
    import pandas as pd
    from test_clients_together import ATOL, RTOL, spec, write_data
    from test_runs_together import final_model, seeded

    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.fl.engine.runs_together import run_together

    d = write_data(tmp_path, 28, 200)
    alone = [seeded(spec(d, f"alone{s}", batch_clients=True, device="cuda", deterministic=True), s) for s in (0, 1)]
    for s in alone:
        engine.run(s, log=lambda m: None)
    side = [seeded(spec(d, f"side{s}", batch_clients=True, device="cuda", deterministic=True), s) for s in (0, 1)]
    run_together(side, log=lambda m: None)
    for a, b in zip(alone, side, strict=True):
        want, got = final_model(a), final_model(b)
        for k in want:
            torch.testing.assert_close(got[k].cpu(), want[k].cpu(), atol=ATOL * 10, rtol=RTOL, msg=k)
        rows_a, rows_b = (pd.read_csv(f"{x.run_dir}/metrics.csv") for x in (a, b))
        for c in (c for c in rows_a.columns if c.startswith(("global_", "val_"))):
            np.testing.assert_allclose(rows_b[c].to_numpy(), rows_a[c].to_numpy(), rtol=1e-4, atol=1e-5, err_msg=c)
