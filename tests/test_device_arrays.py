"""Model arrays are tensors from the client's model to the server's average and back, kept on the job's
device only where server and clients share one process: the same numbers as NumPy's arithmetic and as
arrays kept on the host, bit for bit."""

from __future__ import annotations

import io as _io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import Killed, kill_after_round

from fedmedbench.fl.api.arrays import host_copies, model_arrays, model_tensors, snapshot, weighted_average
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine import job as job_module
from fedmedbench.fl.engine.job import Job, copy_into
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.state.file_format import read_state
from fedmedbench.fl.stopping import DataFreeMonitor


def make_spec(d: Path, method: str, tag: str, device: str = "cpu", **extra) -> RunSpec:
    return fed.resolve_data_shapes(RunSpec(
        run_dir=str(d / f"run-{method}-{tag}"), study="t", dataset="bloodmnist", setting="dir", method=method, seed=0,
        partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28,
        train={"rounds": 3, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "aggregation": "uniform"},
        clients_per_round=3, device=device, eval_every=1, **extra))


def numpy_average(clients: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    """The average in NumPy: float64 terms w_i a_i summed from 0 in client order, integers rounded by np.rint."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    out = {}
    for key, first in clients[0].items():
        acc = sum(wi * a[key].astype(np.float64) for wi, a in zip(w, clients, strict=True))
        out[key] = np.asarray(np.rint(acc) if np.issubdtype(first.dtype, np.integer) else acc).astype(first.dtype)
    return out


def test_tensor_average_is_the_numpy_average_bit_for_bit():
    rng = np.random.default_rng(0)
    clients = [{"w": rng.standard_normal((5, 7)).astype(np.float32), "z": np.array([-0.0, 1.5], dtype=np.float32),
                "n": rng.integers(0, 9, (3,)).astype(np.int64), "h": rng.standard_normal(4).astype(np.float16)}
               for _ in range(5)]
    weights = [3.0, 1.0, 7.0, 2.0, 0.5]
    want = numpy_average(clients, weights)
    got = weighted_average([{k: torch.from_numpy(v) for k, v in c.items()} for c in clients], weights)
    for k, v in want.items():
        assert got[k].dtype == torch.from_numpy(v).dtype and tuple(got[k].shape) == v.shape
        assert np.array_equal(got[k].numpy(), v), k
        assert got[k].numpy().tobytes() == v.tobytes(), k  # the same bits, signed zeros included
    assert got["n"].dtype == torch.int64  # integer buffers rounded back, as np.rint


def test_model_tensors_are_independent_copies_in_one_buffer_per_dtype():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    snap = model_tensors(model)
    assert list(snap) == list(model.state_dict())
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert not torch.equal(snap["0.weight"], model[0].weight)  # a copy, not the model's own tensor
    floats = [t for t in snap.values() if t.dtype == torch.float32]
    assert len({t.untyped_storage().data_ptr() for t in floats}) == 1  # one flat buffer for the float entries
    assert snap["1.num_batches_tracked"].dtype == torch.int64


def test_copy_into_checks_keys_and_shapes():
    model = torch.nn.Linear(3, 2)
    arrays = model_arrays(model)
    with pytest.raises(KeyError, match="bias"):
        copy_into(model, {"weight": arrays["weight"]}, ["weight", "bias"])
    with pytest.raises(ValueError, match=r"'weight' has shape \(2, 4\)"):
        copy_into(model, {**arrays, "weight": torch.zeros(2, 4)}, ["weight", "bias"])
    other = {"weight": torch.ones(2, 3), "bias": torch.full((2,), 2.0, dtype=torch.float64)}
    copy_into(model, other, ["weight", "bias"])
    assert torch.equal(model.weight, torch.ones(2, 3)) and torch.equal(model.bias, torch.full((2,), 2.0))


def _run(spec: RunSpec, monkeypatch, on: bool) -> tuple[dict, pd.DataFrame, list[str]]:
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ("cuda", "cpu") if on else ("cuda",))
    logs: list[str] = []
    engine.run(spec, log=logs.append)
    model = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    return model, pd.read_csv(Path(spec.run_dir) / "metrics.csv").drop(columns="elapsed_s"), logs


@pytest.mark.parametrize("method,params", [("fedavg", {}), ("fedavg", {"global_lr": 0.7}), ("fedprox", {"mu": 0.1}),
                                           ("fedsam", {"rho": 0.05}), ("scaffold", {}),
                                           ("scaffold", {"global_lr": 0.7, "local_iterations": "per_client"}),
                                           ("fedgamma", {"rho": 0.05}), ("feddyn", {"lamb": 0.1}),
                                           ("feddyn", {"lamb": 0.1, "global_lr": 0.7}),
                                           ("fedsmoo", {"rho": 0.05, "lamb": 0.1}), ("fedspeed", {"rho": 0.05, "lamb": 0.1}),
                                           ("fedlesam", {"rho": 0.05}),
                                           ("fedlesam", {"rho": 0.05, "estimate": "previous_global"}),
                                           ("fedwmsam", {"rho": 0.05}),
                                           ("fedwmsam", {"rho": 0.05, "local_iterations": "per_client"}),
                                           ("fedadam", {}), ("fedyogi", {}), ("fedadagrad", {}), ("fedbn", {})])
def test_a_device_arrays_run_ends_as_the_host_arrays_run(blood_dir, monkeypatch, method, params):
    host, host_rows, host_logs = _run(make_spec(blood_dir, method, "host", method_params=params), monkeypatch, on=False)
    dev, dev_rows, dev_logs = _run(make_spec(blood_dir, method, "dev", method_params=params), monkeypatch, on=True)
    assert any("model arrays stay on cpu" in line for line in dev_logs)
    assert not any("stay on" in line for line in host_logs)
    assert host.keys() == dev.keys() and all(torch.equal(host[k], dev[k]) for k in host)
    pd.testing.assert_frame_equal(host_rows, dev_rows)  # every metric, task norms included


def test_arrays_stay_on_the_device_only_where_server_and_clients_share_the_process(blood_dir, monkeypatch):
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ("cuda", "cpu"))
    job = Job(make_spec(blood_dir, "fedavg", "a"))
    assert job.array_device == torch.device("cpu")  # until the engine places them
    assert job.place_arrays(in_process=True) and job.array_device == job.device
    assert not Job(make_spec(blood_dir, "fedavg", "b")).place_arrays(in_process=False)  # Ray actors, deployed sites
    assert Job(make_spec(blood_dir, "local", "c")).place_arrays(in_process=True)  # every method: no method opts in
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ("cuda",))
    job = Job(make_spec(blood_dir, "fedavg", "e"))
    assert not job.place_arrays(in_process=True) and job.array_device == torch.device("cpu")  # the default on a CPU


def test_held_tensors_are_handed_over_and_serialise_as_numpy():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    held = engine.HeldArray(t)
    assert held.value() is t and held.dtype == "float32" and held.shape == (2, 3)
    copy = held.numpy()
    assert np.array_equal(copy, t.numpy()) and not np.shares_memory(copy, t.numpy())  # a copy, as np.load gives
    assert held.data == engine.Array.from_numpy_ndarray(t.numpy()).data  # what a serialising path sends
    back = engine._from_record(engine._to_record({"w": t}, held=True))
    assert back["w"] is t
    record = engine._to_record({"w": t}, held=False)  # no tensor ever reaches the wire
    assert type(record["w"]) is engine.Array and record["w"].data == engine.Array.from_numpy_ndarray(t.numpy()).data
    wire = engine._from_record(record)
    assert wire["w"] is not t and torch.equal(wire["w"], t) and wire["w"].dtype == torch.float32


def test_task_norm_is_the_float64_norm_of_the_difference():
    rng = np.random.default_rng(1)
    theta0 = {k: rng.standard_normal(50).astype(np.float32) for k in "abc"}
    theta = {k: v + rng.standard_normal(50).astype(np.float32) for k, v in theta0.items()}
    oracle = np.sqrt(sum(((theta[k].astype(np.float64) - theta0[k]) ** 2).sum() for k in theta))
    tensors = {k: torch.from_numpy(v.copy()) for k, v in theta.items()}
    got = DataFreeMonitor.task_norm(tensors, {k: torch.from_numpy(v) for k, v in theta0.items()})
    assert abs(got - oracle) <= 1e-12 * got
    assert all(np.array_equal(tensors[k].numpy(), theta[k]) for k in theta)  # the differences go to a copy
    wide = {k: t.double() for k, t in tensors.items()}  # float64 arrays: converted "in place" would alias them
    assert DataFreeMonitor.task_norm(wide, {k: torch.from_numpy(v) for k, v in theta0.items()}) == got
    assert all(np.array_equal(wide[k].numpy(), theta[k].astype(np.float64)) for k in theta)


@pytest.mark.parametrize("seed", range(6))
def test_task_norm_is_the_same_bits_for_every_layout_of_the_arrays(seed):
    """Many entries of many sizes (a model's): separate tensors, views of one buffer (what a client sends and
    a state file reads back) and a float64 or float32 theta_0 give the same bits."""
    rng = np.random.default_rng(seed)
    theta0 = {f"w{i}": rng.standard_normal(int(rng.integers(1, 5000))).astype(np.float32) for i in range(20)}
    theta = {k: torch.from_numpy(v + rng.standard_normal(v.shape).astype(np.float32)) for k, v in theta0.items()}
    separate = DataFreeMonitor.task_norm(theta, {k: torch.from_numpy(v) for k, v in theta0.items()})
    views = snapshot(theta)
    assert len({t.untyped_storage().data_ptr() for t in views.values()}) == 1
    assert DataFreeMonitor.task_norm(views, {k: torch.from_numpy(v).double() for k, v in theta0.items()}) == separate
    assert DataFreeMonitor.task_norm({}, {}) == 0.0


def test_theta0_is_written_once_and_checked_on_resume(blood_dir, tmp_path):
    spec = make_spec(blood_dir, "fedavg", "theta0", keep_checkpoints=True)
    spec.run_dir = str(tmp_path / "run")
    engine.run(spec, log=lambda m: None)
    folder = checkpoint.checkpoint_dir(spec.run_dir)
    payload = read_state(folder / "server.pt")
    assert "_theta0" not in payload["server_state"] and payload["server_state"]["_theta0_sha256"]
    theta0 = torch.load(folder / "theta0.pt", weights_only=True)
    fed.seed_everything(spec.seed)  # theta_0 is the seeded initial model's parameters
    model = fed.new_model(spec)
    assert all(torch.equal(theta0[k], p.detach()) for k, p in model.named_parameters())
    state = checkpoint.load(spec.run_dir, spec.run_hash())
    assert all(torch.equal(state.server_state["_theta0"][k], theta0[k]) for k in theta0)
    buf = _io.BytesIO()
    torch.save({k: v + 1 for k, v in theta0.items()}, buf)
    (folder / "theta0.pt").write_bytes(buf.getvalue())
    with pytest.raises(RuntimeError, match="theta0.pt: its sha256 differs.*resume=restart"):
        checkpoint.load(spec.run_dir, spec.run_hash())
    (folder / "theta0.pt").unlink()
    with pytest.raises(RuntimeError, match="theta0.pt: missing"):
        checkpoint.load(spec.run_dir, spec.run_hash())


def test_checkpoint_arrays_from_tensors_own_their_memory():
    flat = torch.arange(10, dtype=torch.float32)
    out = host_copies({"a": flat[:4].view(2, 2), "b": flat[4:]})
    assert out["a"].untyped_storage().nbytes() == 16 and torch.equal(out["b"], flat[4:])


@pytest.mark.parametrize("method,sent,kept", [("scaffold", "delta_c", "c_i"), ("fedwmsam", "delta_c", "c_i"),
                                              ("fedsmoo", "mu", "mu_i")])
def test_a_client_sends_its_model_and_vectors_as_device_tensors(blood_dir, monkeypatch, method, sent, kept):
    monkeypatch.setattr(job_module, "ARRAY_DEVICE_TYPES", ("cuda", "cpu"))
    job = Job(make_spec(blood_dir, method, "client"))
    assert job.place_arrays(in_process=True)
    model = job.new_model()
    arrays = job.arrays(model_arrays(model, job.shared_keys()))
    result = fed.client_train(job, 0, 1, arrays, steps=2)
    assert all(isinstance(v, torch.Tensor) for v in result.arrays.values())
    vectors = result.extras[sent]
    assert set(vectors) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vectors.values())
    assert not job.state_store.deferred and job.state_store.unwritten() == []  # outside the engine: written at once
    state = read_state(Path(job.spec.run_dir) / "checkpoint" / "clients" / "00000" / "r000001.pt")
    assert all(v.device.type == "cpu" for v in state[kept].values())
    # first round: c = c_i = 0, so delta_c = c_i+ (SCAFFOLD, FedWMSAM); FedSMOO sends its dual mu_i itself
    assert all(torch.equal(state[kept][n], vectors[n]) for n in vectors)


@pytest.mark.parametrize("method,params", [("feddyn", {"lamb": 0.1}), ("fedsmoo", {"rho": 0.05, "lamb": 0.1}),
                                           ("fedlesam", {"rho": 0.05, "estimate": "previous_global"}),
                                           ("fedwmsam", {"rho": 0.05}), ("fedadam", {}), ("fedbn", {})])
def test_a_device_arrays_run_killed_and_resumed_ends_as_the_host_run(blood_dir, monkeypatch, method, params):
    """Server state (FedDyn's h, FedWMSAM's momentum and alpha, FedSMOO's s, FedAdam's m and v) and client states
    (h_i, mu_i, c_i, the previous global model, FedBN's batch norm) come back from the checkpoint on the CPU and go on where the arrays are."""
    host, host_rows, _ = _run(make_spec(blood_dir, method, "host-k", method_params=params), monkeypatch, on=False)
    spec = make_spec(blood_dir, method, "dev-k", method_params=params)
    revive = kill_after_round(monkeypatch, 2)
    with pytest.raises(Killed):
        _run(spec, monkeypatch, on=True)
    revive()
    dev, dev_rows, logs = _run(spec, monkeypatch, on=True)
    assert any("resuming from checkpoint at round 2/3" in line for line in logs)
    assert any("model arrays stay on cpu" in line for line in logs)
    assert host.keys() == dev.keys() and all(torch.equal(host[k], dev[k]) for k in host)
    pd.testing.assert_frame_equal(host_rows, dev_rows)
