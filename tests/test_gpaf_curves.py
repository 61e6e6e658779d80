"""GPAF Fig. 5 data: the clients' training loss per local epoch (Fig. 5b) and the clients' own models'
validation accuracy after local training, averaged over clients (Fig. 5a)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers.clients import client_ctx, fresh_global, toy_data, toy_spec, train_config
from torch import nn

from fedmedbench.data import synthetic
from fedmedbench.fl.api import ClientResult, Method
from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.api.registry import METHODS, get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.training import batch_indices, epoch_means, to_float
from fedmedbench.partition.schemes import seal
from fedmedbench.workflow import io

# ---------------------------------------------------------------- a client's per-epoch losses


def step_losses(ctx_model: nn.Module, data, steps: int, generator: torch.Generator, batch_size: int) -> list[float]:
    """The losses of a client whose weights do not move (lr 0): CE of each of its batches, replayed."""
    model = copy.deepcopy(ctx_model).train()
    with torch.no_grad():
        return [float(F.cross_entropy(model(to_float(data.train_x[idx], torch.device("cpu"))), data.train_y[idx]))
                for idx in batch_indices(data.num_train, batch_size, steps, generator)]


@pytest.mark.parametrize("method,epoch_steps,params", [("fedavg", None, {}), ("centralized", None, {}),
                                                       ("centralized", 4, {}), ("moon", None, {"mu": 5.0})])
def test_per_epoch_losses_are_the_means_of_each_epochs_steps(method, epoch_steps, params):
    """E = 2 on 40 examples, batch 16: an epoch is 3 steps (16, 16, 8; batch_indices reshuffles after
    them), or ``epoch_steps`` (the centralized client's share of its round budget). MOON's first
    round is plain cross-entropy, so every loop's step loss is the replayed CE."""
    data, spec = toy_data(40), toy_spec(method)
    m = get_method(method, params)
    cfg = train_config(lr=0.0, optimizer="sgd", local_epochs=2)
    ctx = client_ctx(m, spec, fresh_global(m, spec), data, steps=6, cfg=cfg)
    ctx.epoch_steps = epoch_steps
    expected = step_losses(ctx.model, data, 6, fed.client_generator(0, 1, 0), 16)
    result = m.client_fit(ctx)
    per = epoch_steps or 3
    keys = sorted(k for k in result.metrics if k.startswith("train_loss_e"))
    assert keys == ["train_loss_e1", "train_loss_e2"]
    assert result.metrics["train_loss_e1"] == pytest.approx(np.mean(expected[:per]), rel=1e-6)
    assert result.metrics["train_loss_e2"] == pytest.approx(np.mean(expected[per:]), rel=1e-6)
    assert result.metrics["train_loss"] == pytest.approx(np.mean(expected), rel=1e-6)


@pytest.mark.parametrize("method", ["feddg", "gpaf"])
def test_per_epoch_losses_of_feddg_and_gpaf_split_their_train_loss(method):
    """Their step losses are their own objectives (episode, L_total): the epochs' means, weighted by
    the epochs' steps (3 and 2), give back train_loss."""
    data, spec = toy_data(40), toy_spec(method)
    m = get_method(method, {})
    result = m.client_fit(client_ctx(m, spec, fresh_global(m, spec), data, steps=5, cfg=train_config(local_epochs=2)))
    e1, e2 = result.metrics["train_loss_e1"], result.metrics["train_loss_e2"]
    assert "train_loss_e3" not in result.metrics and e1 != e2
    assert (3 * e1 + 2 * e2) / 5 == pytest.approx(result.metrics["train_loss"], rel=1e-9)


def test_epoch_means_of_hand_made_steps():
    assert epoch_means([1.0, 2.0, 3.0, 10.0, 20.0], 3) == [2.0, 15.0]
    assert epoch_means([], 3) == []
    with pytest.raises(ValueError, match="steps_per_epoch"):
        epoch_means([1.0], 0)


# ---------------------------------------------------------------- the federation's rows


def _two_label_folder(d: Path, train_sizes: tuple[int, int]) -> Path:
    """Client 0 holds only class 0 and client 1 only class 1, in every split; ``train_sizes`` training samples
    each, 8 validation and 8 test samples each."""
    counts = {"train": 120, "val": 40, "test": 40}
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts=counts)
    io.write_npz(d / "b.npz", arrays)
    offset, clients = 0, [{"source": "base"}, {"source": "base"}]
    for split in ("train", "val", "test"):
        labels = arrays[f"{split}_labels"].reshape(-1)
        for c in (0, 1):
            take = train_sizes[c] if split == "train" else 8
            clients[c][split] = [offset + int(i) for i in np.flatnonzero(labels == c)[:take]]
            assert len(clients[c][split]) == take
        offset += counts[split]
    test = clients[0]["test"] + clients[1]["test"]
    io.write_json(d / "p.json", seal({"num_classes": 2, "clients": clients, "global_test": [{"source": "base", "idx": test}]}))
    return d


@pytest.fixture(scope="module")
def two_labels(tmp_path_factory):
    """Two one-class clients of equal sizes (8 training samples each)."""
    return _two_label_folder(tmp_path_factory.mktemp("curves"), (8, 8))


@pytest.fixture(scope="module")
def uneven_labels(tmp_path_factory):
    """Two one-class clients of 10 and 30 training samples: an example-weighted mean differs from a plain one."""
    return _two_label_folder(tmp_path_factory.mktemp("uneven"), (10, 30))


def spec_for(d: Path, name: str, method: str = "fedavg", **kw) -> RunSpec:
    return fed.resolve_data_shapes(RunSpec(run_dir=str(d / name), study="t", dataset="breastmnist", setting="s", method=method, seed=0,
                   partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28, device="cpu",
                   train={"rounds": 1, "local_epochs": 2, "batch_size": 4, "lr": 0.05}, **kw))


class HandMade:
    """A transport whose clients reply with fixed metrics and the global arrays."""

    def __init__(self, metrics: dict[int, dict[str, float]], sizes: dict[int, int]) -> None:
        self.metrics, self.sizes = metrics, sizes

    def train(self, rnd, steps, arrays, broadcast):
        return {p: ClientResult(dict(arrays), self.sizes[p], dict(self.metrics[p])) for p in steps}

    def evaluate(self, rnd, pids, arrays):
        return {}


def test_logged_per_epoch_losses_are_the_example_weighted_average_of_the_clients(uneven_labels):
    spec = spec_for(uneven_labels, "weighted")
    federation = fed.Federation(spec, log=lambda m: None)
    transport = HandMade({0: {"train_loss": 0.75, "train_loss_e1": 1.0, "train_loss_e2": 0.5},
                          1: {"train_loss": 1.5, "train_loss_e1": 2.0, "train_loss_e2": 1.0}}, {0: 10, 1: 30})
    federation.stage_outputs(federation.run(transport))
    row = pd.read_csv(Path(spec.run_dir) / "metrics.csv").iloc[0]
    assert row["train_loss_e1"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert row["train_loss_e2"] == pytest.approx((10 * 0.5 + 30 * 1.0) / 40)
    assert row["train_loss"] == pytest.approx((10 * 0.75 + 30 * 1.5) / 40)
    assert "client_val_accuracy" not in row  # client_validation is off


class PerfectLocal(Method):
    """A local update that makes the model predict the client's own (only) label: zero weights and a
    +10 bias on that class in the last linear layer; the average of two such clients is a tie."""

    def client_fit(self, ctx):
        last = [m for m in ctx.model.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.copy_(10.0 * F.one_hot(ctx.data.train_y[0], last.bias.numel()).float())
        return ClientResult(model_arrays(ctx.model), ctx.data.num_train, {"train_loss": 0.0})


def test_client_validation_uses_each_clients_own_model_after_local_training(two_labels, monkeypatch):
    monkeypatch.setitem(METHODS, "perfect_local", PerfectLocal)
    spec = spec_for(two_labels, "client_val", method="perfect_local", client_validation="mean")
    federation = fed.Federation(spec, log=lambda m: None)
    federation.stage_outputs(federation.run(fed.InProcessTransport(federation.job)))
    row = pd.read_csv(Path(spec.run_dir) / "metrics.csv").iloc[0]
    assert row["client_val_accuracy"] == 1.0  # each client's own model on its own validation data
    assert row["val_accuracy"] == 0.5  # the averaged (global) model: a tie, class 0 for every image


def test_client_validation_average_is_plain_or_by_validation_examples():
    results = [ClientResult({}, 100, {"client_val_accuracy": 1.0, "client_val_examples": 10.0}),
               ClientResult({}, 100, {"client_val_accuracy": 0.5, "client_val_examples": 30.0}),
               ClientResult({}, 100, {"client_val_accuracy": float("nan"), "client_val_examples": 0.0})]
    assert fed.client_validation_row(results, ("accuracy",), "mean") == {"client_val_accuracy": 0.75}
    assert fed.client_validation_row(results, ("accuracy",), "weighted") == {"client_val_accuracy": 0.625}
    with pytest.raises(ValueError, match="client_validation"):
        fed.client_validation_row(results, ("accuracy",), "median")


def test_an_unknown_client_validation_average_fails_before_training(two_labels):
    with pytest.raises(ValueError, match="client_validation = 'median'"):
        fed.Federation(spec_for(two_labels, "bad", client_validation="median"), log=lambda m: None)


def test_client_validation_off_leaves_the_run_hash_as_before(two_labels):
    """Studies without the option keep their run hashes (no rerun, resumable checkpoints)."""
    spec = RunSpec(run_dir="x", study="t", dataset="breastmnist", setting="s", method="fedavg", seed=0,
                   partition_path="p.json", sources={"base": "b.npz"}, image_size=28,
                   train={"rounds": 1, "local_epochs": 2, "batch_size": 4, "lr": 0.05})
    assert spec.run_hash() == "e0ff95ab7adc1ab1"  # the hash before client_validation existed
    on = RunSpec(**{**spec.to_dict(), "client_validation": "mean"})
    assert on.run_hash() != spec.run_hash()
