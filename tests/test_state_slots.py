"""State slots: a model's state entries read and written without a state_dict walk, following the
tensors a model swaps in (``Module.to``, channels_last), and refused where state_dict is more than
parameters and buffers."""

from __future__ import annotations

import numpy as np
import torch
from test_job import spec  # noqa: F401 - the job tests' run spec, a fixture here too
from torch import nn

from fedmedbench.fl.api import ClientContext
from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.engine.job import Job
from fedmedbench.fl.state.slots import StateSlots


class Tied(nn.Module):
    """Parameters, persistent and non-persistent buffers, a module reached twice, a None bias."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)
        self.again = self.head  # the same module under a second name: state_dict lists it twice
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


def _same(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> bool:
    return list(state) == list(reference) and all(
        state[k].data_ptr() == reference[k].data_ptr() and state[k].shape == reference[k].shape for k in reference)


def test_state_is_the_state_dict_entries_in_order_sharing_memory():
    model = Tied()
    slots = StateSlots.of(model)
    assert slots is not None and slots.model is model
    assert slots.keys() == list(model.state_dict())
    assert "again.weight" in slots.keys() and "scratch" not in slots.keys()
    assert _same(slots.state(), model.state_dict())
    assert all(not t.requires_grad for t in slots.state().values())
    keys = ["bn.running_mean", "head.bias"]
    assert _same(slots.state(keys), {k: model.state_dict()[k] for k in keys})


def test_slots_follow_tensors_the_model_swaps_in():
    model = Tied()
    slots = StateSlots.of(model)
    before = slots.state()["conv.weight"].data_ptr()
    model.to(memory_format=torch.channels_last)  # new data for the 4-d weight
    model.double()  # new data for every float parameter, new buffer objects
    assert slots.state()["conv.weight"].data_ptr() != before
    assert _same(slots.state(), model.state_dict())
    assert slots.state()["bn.running_var"].dtype == torch.float64
    with torch.no_grad():  # writing through the slots writes the model
        torch._foreach_copy_(slots.tensors(["head.bias", "bn.num_batches_tracked"]),
                             [torch.tensor([5.0, 6.0], dtype=torch.float64), torch.tensor(7)])
    assert model.head.bias.tolist() == [5.0, 6.0] and int(model.bn.num_batches_tracked) == 7


def test_on_checks_every_parameter_and_buffer_non_persistent_included():
    model = Tied()
    slots = StateSlots.of(model)
    assert slots.on(torch.device("cpu")) and slots.on("cpu")
    model.scratch = model.scratch.to("meta")  # a buffer state_dict does not list
    assert not slots.on(torch.device("cpu"))


def test_models_whose_state_dict_is_more_than_parameters_and_buffers_get_none():
    class Extra(nn.Linear):
        def get_extra_state(self):
            return {"note": 1}

        def set_extra_state(self, state):
            pass

    assert StateSlots.of(Extra(2, 2)) is None
    hooked = nn.Linear(2, 2)
    hooked._register_state_dict_hook(lambda module, state, prefix, local: state.pop(prefix + "bias"))
    assert StateSlots.of(hooked) is None


def test_job_loads_through_the_slots_after_the_model_changed_its_tensors(spec):  # noqa: F811
    job = Job(spec)
    assert job.slots is not None and job.slots.model is job.model_with(model_arrays(job.new_model()))
    torch.manual_seed(3)
    arrays = model_arrays(job.new_model())
    model = job.model_with(arrays)
    model.to(memory_format=torch.channels_last)  # what train.channels_last does inside a client step
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    again = job.model_with(arrays)
    assert again is model
    assert all(np.array_equal(v, arrays[k]) for k, v in model_arrays(again).items())


def test_result_arrays_read_the_slots_only_for_their_own_model(spec):  # noqa: F811
    job = Job(spec)
    model = job.model_with(model_arrays(job.new_model()))
    calls = []

    class Counting(StateSlots):
        def state(self, keys=None):
            calls.append(keys)
            return super().state(keys)

    slots = Counting(model, job.slots._entries, job.slots._placed)
    ctx = ClientContext(pid=0, rnd=1, model=model, data=None, train=job.train, device=job.device,
                        generator=torch.Generator(), state={}, steps=1, slots=slots)
    for where in (torch.device("cpu"), job.device):  # where the job keeps its arrays
        ctx.array_device = where
        out = ctx.result_arrays()
        reference = model.state_dict()
        assert list(out) == list(reference)
        assert all(np.array_equal(np.asarray(out[k]), reference[k].numpy()) for k in reference)
    assert calls == [None, None]
    other = job.new_model()
    ctx.result_arrays(other)  # another model: its own state_dict, not the slots
    assert calls == [None, None]

