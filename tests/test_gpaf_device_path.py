"""The GPAF study's methods (GPAF, MOON, FedDG, centralized) on the engine's GPU path, checked on the CPU.

A client reads its losses from the device once, after its last step (not per step, which would wait
for the device every step); a non-finite step still fails the client and names the round and step; and
with the model's arrays and the client data kept where the model is (as on a GPU), a run ends with
the same weights and metrics, bit for bit, as the host run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import Killed, kill_after_round
from helpers.clients import client_ctx, fresh_global, toy_data, toy_spec, train_config
from torch.utils._python_dispatch import TorchDispatchMode

from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine import job as job_module
from fedmedbench.fl.methods.gpaf import GPAF, server_generator
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.training import NonFiniteLossError
from fedmedbench.models.vae import LatentDiscriminator

METHODS = ["gpaf", "moon", "feddg", "centralized"]
CACHES_DATA = job_module.Job._caches_data


class FloatReads(TorchDispatchMode):
    """Counts reads of floating-point scalars to the host (``float(t)``, ``t.item()``): on a GPU each waits
    for the device. Integer reads (labels checked by ``one_hot`` on the CPU, CPU random draws) are left out."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_local_scalar_dense" and args[0].dtype.is_floating_point:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _spec(name: str):
    return toy_spec("moon" if name == "centralized" else name)


@pytest.mark.parametrize("name", METHODS)
def test_a_client_reads_its_losses_once_not_per_step(name, monkeypatch):
    # Adam reads its step count (a CPU tensor, also on a GPU) per step: D_s steps with SGD here
    monkeypatch.setattr(GPAF, "disc_optimizer", lambda self, disc: torch.optim.SGD(disc.parameters(), lr=1e-3))
    method = get_method(name, {"server_epochs": 1} if name == "gpaf" else {})
    spec, cfg = _spec(name), train_config(optimizer="sgd", momentum=0.9, grad_clip=1.0)
    arrays = fresh_global(method, spec)
    reads = []
    for steps in (2, 6):
        state: dict = {}
        method.client_fit(client_ctx(method, spec, arrays, toy_data(48), steps=1, state=state, cfg=cfg))
        ctx = client_ctx(method, spec, arrays, toy_data(48), rnd=2, steps=steps, state=state, cfg=cfg)  # MOON: l_con on
        with FloatReads() as counter:
            result = method.client_fit(ctx)
        assert np.isfinite(result.metrics["train_loss"])
        reads.append(counter.count)
    assert reads[0] == reads[1]


def _poisoned(arrays: dict) -> dict:
    """Every floating-point array NaN in its first entry: the first step's loss is NaN."""
    out = {}
    for k, v in arrays.items():
        v = v.clone()
        if v.is_floating_point() and v.numel():
            v.view(-1)[0] = math.nan
        out[k] = v
    return out


@pytest.mark.parametrize("name,what", [("gpaf", "GPAF client"), ("moon", "MOON"), ("feddg", "FedDG")])
def test_a_non_finite_step_fails_the_client_naming_round_and_step(name, what):
    method = get_method(name, {"server_epochs": 1} if name == "gpaf" else {})
    spec = _spec(name)
    arrays = _poisoned(fresh_global(method, spec))
    ctx = client_ctx(method, spec, arrays, toy_data(48), rnd=3, steps=3)
    with pytest.raises(NonFiniteLossError, match=rf"non-finite {what} loss \(nan\) at round 3, step 1; lower train.lr"):
        method.client_fit(ctx)


def test_a_non_finite_generator_step_fails_the_server_naming_it():
    method = GPAF(server_epochs=2)
    model = method.build_model(toy_spec("gpaf"))
    with torch.no_grad():
        next(model.generator.parameters()).fill_(float("nan"))
    ensemble = [model.classifier]
    with pytest.raises(NonFiniteLossError, match=r"non-finite GPAF generator loss \(nan\) at round 4, step 1; lower generator_lr"):
        method.train_generator(model.generator, ensemble, model.classifier, LatentDiscriminator(method.p["latent_dim"]),
                               server_generator(0, 4), torch.device("cpu"), rnd=4, batch_size=32,
                               label_probs=np.array([0.5, 0.5]))


def breast_spec(d: Path, method: str, params: dict, tag: str, device: str = "cpu", **extra) -> RunSpec:
    """A 2-round GPAF-study run on ``breast_domains_dir``'s data (client validation and client models on)."""
    return RunSpec(run_dir=str(d / f"{method}-{tag}"), study="t", dataset="breastmnist", setting="dom", method=method, seed=0,
                   partition_path=str(d / "p.json"), sources={k: str(d / "b.npz") for k in ("a", "b", "base")},
                   image_size=28, model="gpaf_cnn", method_params=params, device=device, save_client_models=True,
                   client_validation="mean", **extra,
                   train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 1e-3, "optimizer": "adam", "grad_clip": 5.0})


def _run(d: Path, method: str, params: dict, tag: str, monkeypatch, on: bool) -> tuple[dict, pd.DataFrame, dict, list]:
    """One run; ``on``: arrays and client data kept where the model is (the CPU here, as on a GPU)."""
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ("cuda", "cpu") if on else ("cuda",))
    monkeypatch.setattr(job_module, "CACHED_DEVICE_TYPES", ("cuda", "cpu") if on else ("cuda",))
    monkeypatch.setattr(job_module, "free_device_memory", lambda device: 1 << 30)
    cached: list[bool] = []
    monkeypatch.setattr(job_module.Job, "_caches_data", lambda self, data: cached.append(CACHES_DATA(self, data)) or cached[-1])
    spec = breast_spec(d, method, params, tag)
    logs: list[str] = []
    engine.run(spec, log=logs.append)
    run = Path(spec.run_dir)
    return (torch.load(run / "model.pt", weights_only=True), pd.read_csv(run / "metrics.csv").drop(columns="elapsed_s"),
            torch.load(run / "client_models.pt", weights_only=True), [logs, cached])


GPAF_STUDY_RUNS = [("gpaf", {"server_epochs": 2}), ("moon", {}), ("feddg", {"window": 0.05, "ratio_range": [0.0, 1.0]}),
                   ("centralized", {})]


@pytest.mark.parametrize("method,params", GPAF_STUDY_RUNS)
def test_a_device_path_run_ends_as_the_host_run(breast_domains_dir, monkeypatch, method, params):
    d = breast_domains_dir
    host, host_rows, host_clients, (host_logs, host_cached) = _run(d, method, params, "host", monkeypatch, on=False)
    dev, dev_rows, dev_clients, (dev_logs, dev_cached) = _run(d, method, params, "dev", monkeypatch, on=True)
    assert any("model arrays stay on cpu" in line for line in dev_logs) and any(dev_cached)
    assert not any("stay on" in line for line in host_logs) and not any(host_cached)
    assert host.keys() == dev.keys() and all(torch.equal(host[k], dev[k]) for k in host)
    assert host_clients.keys() == dev_clients.keys()
    assert all(torch.equal(host_clients[c][k], dev_clients[c][k]) for c in host_clients for k in host_clients[c])
    pd.testing.assert_frame_equal(host_rows, dev_rows)  # every metric: losses, client validation, task norms


@pytest.mark.parametrize("method,params", [("gpaf", {"server_epochs": 2}), ("feddg", {})])
def test_a_device_path_run_killed_and_resumed_ends_as_the_host_run(breast_domains_dir, monkeypatch, method, params):
    """GPAF's server state (D_n, the optimizers' moments) and FedDG's amplitude bank come back from the checkpoint
    on the CPU and go on where the arrays are."""
    d = breast_domains_dir
    host, host_rows, host_clients, _ = _run(d, method, params, "host-k", monkeypatch, on=False)
    revive = kill_after_round(monkeypatch, 1)
    with pytest.raises(Killed):
        _run(d, method, params, "dev-k", monkeypatch, on=True)
    revive()
    dev, dev_rows, dev_clients, (logs, _) = _run(d, method, params, "dev-k", monkeypatch, on=True)
    assert any("resuming from checkpoint at round 1/2" in line for line in logs)
    assert host.keys() == dev.keys() and all(torch.equal(host[k], dev[k]) for k in host)
    assert all(torch.equal(host_clients[c][k], dev_clients[c][k]) for c in host_clients for k in host_clients[c])
    pd.testing.assert_frame_equal(host_rows, dev_rows)
