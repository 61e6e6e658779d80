"""End to end through the Flower engine (2 rounds, tiny data): gpaf, moon, feddg (and centralized on gpaf_cnn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state.file_format import read_state

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def workdir(breast_domains_dir):
    return breast_domains_dir


def spec_for(workdir: Path, method: str, name: str, **params) -> RunSpec:
    return RunSpec(
        run_dir=str(workdir / name), study="t", dataset="breastmnist", setting="dom", method=method, seed=0,
        partition_path=str(workdir / "p.json"), sources={"a": str(workdir / "b.npz"), "b": str(workdir / "b.npz"),
                                                                "base": str(workdir / "b.npz")},
        image_size=28, model="gpaf_cnn", method_params=params, device="cpu", threads=2, save_client_models=True,
        train={"rounds": 2, "local_epochs": 1, "batch_size": 32, "lr": 1e-3, "optimizer": "adam"},
    )


def run(spec: RunSpec) -> str:
    code = ("import json,sys; from fedmedbench.fl.spec import RunSpec; from fedmedbench.fl.engine import flower as engine; "
            "engine.run(RunSpec.from_dict(json.loads(sys.argv[1])))")
    env = {**os.environ, "PYTHONPATH": str(SRC)}  # Ray actors import this checkout
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec.to_dict())], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def common_checks(spec: RunSpec) -> dict:
    run_dir = Path(spec.run_dir)
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert list(metrics["round"]) == [1, 2] and metrics["global_accuracy"].notna().all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_run"] == 2 and summary["client_models"] == "client_models.pt"
    return torch.load(run_dir / "client_models.pt", weights_only=True)


@pytest.mark.slow
def test_gpaf_end_to_end_and_deterministic(workdir):
    spec = spec_for(workdir, "gpaf", "gpaf", server_epochs=3)
    run(spec)
    clients = common_checks(spec)
    assert sorted(clients) == ["0", "1"]
    assert all(k.startswith(("encoder.", "classifier.")) for c in clients.values() for k in c)
    model = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    assert any(k.startswith("generator.") for k in model)
    states = sorted((Path(spec.run_dir) / "checkpoint" / "clients").glob("*/r*.pt"))
    assert len(states) == 2 and set(read_state(states[0])) == {"decoder", "disc"}
    server = read_state(Path(spec.run_dir) / "checkpoint" / "server.pt")
    assert "gpaf_dn" in server["server_state"] and len(server["server_state"]["gpaf_generator_losses"]) == 2
    # a second run in other processes gives the same model (every random draw is seeded)
    again = spec_for(workdir, "gpaf", "gpaf_again", server_epochs=3)
    run(again)
    other = torch.load(Path(again.run_dir) / "model.pt", weights_only=True)
    assert all(torch.equal(model[k], other[k]) for k in model)
    # the t-SNE features of the report can be computed from the run
    from fedmedbench.studies.gpaf.report import latent_features

    feats = latent_features(spec.to_dict(), 10, 8, 0)
    assert feats["features"].shape == (10 + 10 + 10 + 10 + 8, 64)
    assert set(feats["groups"]) == {"client 0", "client 1", "global", "generator z*"}


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [("moon", {"mu": 1.0}), ("feddg", {}), ("centralized", {})])
def test_baselines_end_to_end(workdir, method, params):
    spec = spec_for(workdir, method, method, **params)
    run(spec)
    clients = common_checks(spec)
    assert sorted(clients) == (["0"] if method == "centralized" else ["0", "1"])
    server = read_state(Path(spec.run_dir) / "checkpoint" / "server.pt")
    if method == "feddg":
        assert sorted(server["server_state"]["_broadcast"]["amp_bank"]) == ["client0", "client1"]
    if method == "moon":
        states = sorted((Path(spec.run_dir) / "checkpoint" / "clients").glob("*/r*.pt"))
        assert len(states) == 2 and set(read_state(states[0])) == {"prev"}


@pytest.mark.slow
def test_client_models_of_an_earlier_round_come_with_that_rounds_global_model(workdir):
    """Fig. 4 (t-SNE at iteration 8): client_models_round keeps that round's client models and global model."""
    import dataclasses

    import numpy as np

    from fedmedbench.fl.api.arrays import weighted_average

    spec = dataclasses.replace(spec_for(workdir, "fedavg", "kept_round1"), client_models_round=1)
    assert spec.run_hash() != spec_for(workdir, "fedavg", "kept_round1").run_hash()
    run(spec)
    run_dir = Path(spec.run_dir)
    kept = torch.load(run_dir / "client_models.pt", weights_only=True)
    assert sorted(kept) == ["0", "1", "global"]
    assert json.loads((run_dir / "summary.json").read_text())["client_models_round"] == 1
    sizes = [len(c["train"]) for c in json.loads((workdir / "p.json").read_text())["clients"]]
    avg = weighted_average([{k: v.numpy() for k, v in kept[p].items()} for p in ("0", "1")], sizes)
    params = [k for k in avg if "num_batches_tracked" not in k]
    assert all(np.allclose(kept["global"][k].numpy(), avg[k], atol=1e-6) for k in params)  # round 1's FedAvg
    final = torch.load(run_dir / "model.pt", weights_only=True)
    assert any(not torch.equal(final[k], kept["global"][k]) for k in params)  # not the last round's model
