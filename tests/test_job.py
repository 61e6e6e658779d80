"""The resolved job: resident model reset per call, device-data cache guard, held arrays, one loss read per client."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import message_from_proto, message_to_proto
from helpers import split_labels

from fedmedbench.data import synthetic
from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine import job as job_module
from fedmedbench.fl.engine.inline_grid import InlineGrid
from fedmedbench.fl.engine.job import Job
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.training import NonFiniteLossError, StepLosses, batch_indices, index_device
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 200, "val": 20, "test": 40})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "iid", 4, 0, {}, num_classes=2))
    return fed.resolve_data_shapes(RunSpec(
        run_dir=str(d / "run"), study="t", dataset="breastmnist", setting="iid", method="fedavg", seed=0,
        partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28,
        train={"rounds": 1, "local_epochs": 1, "batch_size": 16, "lr": 0.05}, device="cpu"))


def test_resident_model_is_reused_and_reset_like_a_fresh_one(spec):
    job = Job(spec)
    torch.manual_seed(1)
    arrays = model_arrays(job.new_model())
    model = job.model_with(arrays)
    # what a client step may leave behind: frozen parameters, eval mode, gradients, changed weights
    first = next(model.parameters())
    first.requires_grad_(False)
    model.eval()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    again = job.model_with(arrays)
    assert again is model  # no copy, no rebuild
    assert all(p.requires_grad and p.grad is None for p in again.parameters())
    assert all(m.training for m in again.modules())
    assert all(np.array_equal(v, arrays[k]) for k, v in model_arrays(again).items())


def test_methods_keeping_unshared_entries_get_a_fresh_model(spec):
    class KeepsHead(type(Job(spec).method)):
        def shared_keys(self, model):
            return [k for k in model.state_dict() if not k.startswith("head")][:2]

    job = Job(spec)
    job.method = KeepsHead()
    arrays = model_arrays(job.new_model(), job.shared_keys())
    assert job.model_with(arrays) is not job.model_with(arrays)


def test_device_data_cache_stops_at_the_memory_budget(spec, monkeypatch):
    job = Job(spec)
    sizes = [sum(getattr(job.task.client_data(p), f).nbytes
                 for f in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y")) for p in range(4)]
    budget = sizes[0] + sizes[1]  # room for two clients
    monkeypatch.setattr(job_module, "free_device_memory", lambda device: int(budget / job_module.DEVICE_DATA_SHARE) + 1)
    monkeypatch.setattr(job_module, "CACHED_DEVICE_TYPES", ("cpu",))
    assert job.client_data(0) is job.client_data(0) and job.client_data(1) is job.client_data(1)  # cached
    assert job.client_data(2) is not job.client_data(2)  # over the budget: served from the host each call
    assert job._data_bytes == budget
    # off when the config says so, or for a method whose client step wants host data
    off = Job(RunSpec.from_dict({**spec.to_dict(), "cache_on_device": False}))
    assert off.client_data(0) is not off.client_data(0)
    local = Job(RunSpec.from_dict({**spec.to_dict(), "method": "local"}))
    assert not local.method.device_data and local.client_data(0) is not local.client_data(0)


def test_cpu_never_caches(spec):
    job = Job(spec)
    assert job.client_data(0) is not job.client_data(0)


def test_held_arrays_give_fresh_copies_and_serialise_like_flower():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    held = engine.HeldArray(a)
    got = held.numpy()
    assert np.array_equal(got, a.numpy()) and got.flags.writeable
    got[0, 0] = 99.0
    assert a[0, 0] == 0.0  # the sender's tensor is untouched
    assert held.data == Array.from_numpy_ndarray(a.numpy()).data  # the same bytes if something serialises it
    rec = engine._to_record({"w": a, "b": torch.tensor(2.5, dtype=torch.float64)}, held=True)
    InlineGrid(ClientApp(), 1)  # stamps messages with a ServerApp's identity, as Flower's runtime does
    msg = Message(RecordDict({"arrays": rec, "config": ConfigRecord({"round": 1})}), dst_node_id=5,
                  message_type=MessageType.TRAIN, group_id="1")
    msg.metadata.__dict__["_message_id"] = "m"
    back = message_from_proto(message_to_proto(msg))
    assert isinstance(back.content["arrays"], ArrayRecord)
    assert np.array_equal(back.content["arrays"]["w"].numpy(), a.numpy()) and back.content["arrays"]["b"].numpy() == 2.5


def test_step_losses_are_read_once_and_name_the_first_bad_step():
    log = StepLosses()
    values = [0.5, 0.25, 0.125]
    for v in values:
        log.add(torch.tensor(v, requires_grad=True) * 1.0)
    assert log.mean(rnd=1) == (0.5 + 0.25 + 0.125) / 3
    bad = StepLosses()
    for v in (1.0, math.inf, math.nan):
        bad.add(torch.tensor(v))
    with pytest.raises(NonFiniteLossError, match="at round 7, step 2"):
        bad.mean(rnd=7)
    assert StepLosses().mean(rnd=1) == 0.0


def test_batch_indices_are_the_same_draws_on_any_device_copied_there_once_an_epoch():
    """Indices into data on a GPU are put there once per epoch (indexing GPU data with CPU indices copies
    them per batch and waits for the GPU each time); the draws are the CPU's wherever they go."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.overloadpacket.__name__ in ("_to_copy", "copy_")
            return func(*args, **(kwargs or {}))

    def draw(device):
        return list(batch_indices(10, 3, 8, torch.Generator().manual_seed(5), device))  # 4 batches an epoch: 2 epochs

    plain = draw(None)
    assert [len(i) for i in plain] == [3, 3, 3, 1] * 2
    assert all(torch.equal(a, b) for a, b in zip(plain, draw("cpu"), strict=True))
    with Copies() as copies:
        on_meta = draw("meta")  # a device that is not the CPU, on any machine
    assert all(i.device.type == "meta" and i.shape == p.shape for i, p in zip(on_meta, plain, strict=True))
    assert copies.n == 2
    with Copies() as copies:
        draw("cpu")
    assert copies.n == 0


def test_batch_indices_go_where_the_data_is_or_stay_on_the_cpu():
    cpu, meta = torch.zeros(3), torch.zeros(3, device="meta")
    assert index_device(cpu, cpu.long()) == torch.device("cpu")
    assert index_device(meta, meta.long()) == torch.device("meta")
    assert index_device(meta, cpu) == torch.device("cpu")  # a CPU tensor cannot take device indices


def test_a_spec_with_an_unknown_field_is_refused_naming_it():
    """A spec file from another version (a field since removed, e.g. a retired engine option) fails clearly."""
    from fedmedbench.fl.spec import RunSpec

    good = RunSpec(run_dir="r", study="s", dataset="d", setting="x", method="fedavg", seed=0, partition_path="p",
                   sources={}, image_size=28)
    assert RunSpec.from_json(good.to_json()) == good
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['keep_on_gpu'\]"):
        RunSpec.from_dict({**good.to_dict(), "keep_on_gpu": True})


def test_a_spec_with_an_unknown_train_field_is_refused_naming_it():
    from fedmedbench.fl.api import TrainConfig

    train = {"rounds": 2, "local_epochs": 1, "batch_size": 4, "lr": 0.1}
    spec = RunSpec(run_dir="r", study="s", dataset="d", setting="x", method="fedavg", seed=0, partition_path="p",
                   sources={}, image_size=28, train=train)
    assert TrainConfig.from_spec(spec).lr == 0.1
    with pytest.raises(ValueError, match=r"unknown train field\(s\) \['lr_decy'\]"):
        TrainConfig.from_spec(RunSpec.from_dict({**spec.to_dict(), "train": {**train, "lr_decy": 0.9}}))
