"""train.batch_clients: a round's clients trained together equal the same clients trained one by one."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fedmedbench.fl.api import ClientData
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.methods import _together as together
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.training import batch_indices
from fedmedbench.models import MODELS, register_model

#: weights after the rounds below, together vs one by one: float32 rounding of reordered sums, not more
ATOL, RTOL = 2e-6, 1e-4


class LayerNormNet(nn.Module):
    """A small net of ConvNeXt's kinds of layers (dense and depthwise convolutions, LayerNorm, a linear
    head) and no buffers."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 8, 4, stride=4)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.norm = nn.GroupNorm(1, 8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.pw(nn.functional.gelu(self.norm(self.dw(x))))[:, :8]
        return self.head(torch.cat([x, x], 1).mean((2, 3)))


if "ln_net_test" not in MODELS:
    register_model("ln_net_test")(lambda in_channels, num_classes, image_size: LayerNormNet(in_channels, num_classes))


def write_data(d, size: int, train: int):
    from helpers import split_labels

    from fedmedbench.data import synthetic
    from fedmedbench.partition import schemes as P
    from fedmedbench.workflow import io

    arrays = synthetic.generate("bloodmnist", size, seed=0, counts={"train": train, "val": 40, "test": 60})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "fls_quantity", 5, 0, {"alpha": 1.0},
                                                     num_classes=8))
    return d


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("together"), 28, 200)  # clients of 70, 89, 1, 1 and 39 samples


def spec(d, name: str, method: str = "fedavg", model: str = "ln_net_test", batch_clients: bool = False,
         params: dict | None = None, size: int = 28, device: str = "cpu", deterministic: bool = False,
         **train) -> RunSpec:
    t = {"rounds": 3, "local_epochs": 2, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3,
         "grad_clip": 1.0, "aggregation": "uniform", "lr_decay": 0.998, "input_norm": "double", **train}
    if batch_clients:
        t["batch_clients"] = True
    s = RunSpec(run_dir=str(d / name), study="t", dataset="bloodmnist", setting="fls", method=method, seed=0,
                partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=size, model=model,
                train=t, clients_per_round=4, method_params=params or {}, device=device, deterministic=deterministic)
    return fed.resolve_data_shapes(s)


def run(s: RunSpec):
    f = fed.Federation(s, log=lambda m: None)
    return f.run(fed.with_clients_together(fed.InProcessTransport(f.job), f.job, log=lambda m: None))


@pytest.mark.parametrize(("method", "params"), [
    ("fedavg", {}), ("fedprox", {"mu": 0.01}), ("scaffold", {}), ("feddyn", {"lamb": 0.01}), ("fedsam", {"rho": 0.05}),
    ("fedspeed", {"rho": 0.05, "lamb": 0.01}), ("fedgamma", {"rho": 0.05}),
    ("fedlesam", {"rho": 0.05, "estimate": "last_update"}), ("fedlesam", {"rho": 0.05, "estimate": "previous_global",
                                                                          "perturbation_form": "vector"}),
    ("fedsmoo", {"rho": 0.05, "lamb": 0.01}), ("fedwmsam", {"rho": 0.05, "alpha": 0.5}),
    ("fedwmsam", {"rho": 0.05, "alpha": 0.5, "perturbation_form": "vector", "perturbation_sign": 1})])
def test_clients_together_equal_one_by_one(setup, method, params):
    """Unequal clients (1 to 6 batches of 16 an epoch, short last batches, one-sample clients), momentum, weight decay, a clip that
    acts, the double input norm, each method's gradient correction, perturbation (SAM's ascent per step, FedLESAM's
    for the round, none in a client's first round, FedSMOO's dual ascent, FedWMSAM's momentum-guided target in both
    forms), loss weight and what it keeps across rounds (SCAFFOLD's c_i, FedDyn's h_i, FedSMOO's mu_i): the same
    weights to float32 rounding, the same losses and metrics."""
    one = run(spec(setup, f"{method}-one", method, params=params))
    both = run(spec(setup, f"{method}-both", method, params=params, batch_clients=True))
    sizes = fed.Job(spec(setup, "sizes")).task.client_sizes()
    assert len({int(np.ceil(n / 16)) for n in sizes}) > 2  # clients of different step counts
    for k, a in one.arrays.items():
        b = both.arrays[k]
        torch.testing.assert_close(torch.as_tensor(b), torch.as_tensor(a), atol=ATOL, rtol=RTOL, msg=k)
    moved = max(float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max()) for a, b in
                zip(one.arrays.values(), fed.Federation(spec(setup, "init")).initial_state().arrays.values(), strict=True))
    assert moved > 1e-3  # training really moved the weights: the tolerance is far below what a step does
    for r1, r2 in zip(one.rows, both.rows, strict=True):
        assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=1e-5)
        assert r2["global_accuracy"] == pytest.approx(r1["global_accuracy"], abs=1e-9)


def test_a_convnextv2_trains_together_as_one_by_one(tmp_path, monkeypatch):
    """The study's network (timm ConvNeXtV2, thinned): GRN, LayerNorm2d, 1x1 convolutions under vmap."""
    import timm

    setup = write_data(tmp_path, 64, 60)
    create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda name, *a, **kw: create(name, *a, **{**kw, "dims": (8, 16, 32, 64)}))
    one = run(spec(setup, "cnx-one", model="timm:convnextv2_atto", size=64, rounds=2, local_epochs=1))
    both = run(spec(setup, "cnx-both", model="timm:convnextv2_atto", size=64, rounds=2, local_epochs=1,
                    batch_clients=True))
    for k, a in one.arrays.items():
        torch.testing.assert_close(torch.as_tensor(both.arrays[k]), torch.as_tensor(a), atol=ATOL, rtol=RTOL, msg=k)


class Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view
        return func(*args, **(kwargs or {}))


def test_a_round_together_costs_the_ops_of_its_steps_not_of_its_clients(setup, monkeypatch):
    """Twice the clients, the same steps: one by one dispatches twice the ops, one call a step about the same
    (the lever on launch-bound GPUs). The two clients added have batches of 1 against 16: padded into one call they
    would compute 34 samples a step for 18 useful ones, so the plan gives them a call of their own, which costs
    more ops than one call and still far fewer than one by one."""
    from fedmedbench.fl.methods import _batch_plan

    counts = {}
    for name, batched, padding in (("one by one", False, None), ("one call", True, float("inf")),
                                   ("grouped", True, None)):
        monkeypatch.setattr(_batch_plan, "PADDING", padding or together.PADDING)
        s = spec(setup, f"ops-{name}", batch_clients=batched, rounds=1)
        job = fed.Job(s)
        transport = fed.with_clients_together(fed.InProcessTransport(job), job, log=lambda m: None)
        arrays = fed.Federation(s, log=lambda m: None).initial_state().arrays
        for clients in (2, 4):  # clients of 70, 89 (batches of 16), 1 and 1 samples
            steps = {p: 4 for p in range(clients)}
            transport.train(1, steps, arrays, {})  # first use: data loaded, model built
            with Ops() as ops:
                transport.train(1, steps, arrays, {})
            counts[name, clients] = ops.n
    assert counts["one by one", 4] > 1.8 * counts["one by one", 2], counts
    assert counts["one call", 4] < 1.15 * counts["one call", 2], counts
    assert counts["one call", 4] < 0.6 * counts["one by one", 4], counts
    assert counts["grouped", 2] == counts["one call", 2], counts  # batches of 16 and 16: one call either way
    assert counts["one call", 4] < counts["grouped", 4] < 0.85 * counts["one by one", 4], counts


def test_the_plan_draws_each_clients_batches_as_one_by_one():
    """Sizes 5 and 3, batch 2: client 0 takes 4 steps, client 1 two; the rows are its generator's
    permutations cut in batches. At step 1 (batches of 2 and 1) one call would compute 4 samples for 3 useful ones:
    each client is its own call there; where one call is within the bound (a padding of 1.5) the short batch is
    padded with zero weight. After its steps client 1 is no longer computed."""

    class Ctx:
        def __init__(self, n: int, steps: int, seed: int) -> None:
            self.data = ClientData(torch.zeros(n, 1, 2, 2, dtype=torch.uint8), torch.zeros(n, dtype=torch.long),
                                   *(torch.zeros(0),) * 4)
            self.steps, self.generator = steps, torch.Generator().manual_seed(seed)

    expect0 = [i.numpy() for i in batch_indices(5, 2, 4, torch.Generator().manual_seed(1))]
    expect1 = [i.numpy() for i in batch_indices(3, 2, 2, torch.Generator().manual_seed(2))]
    assert [len(e) for e in expect0] == [2, 2, 1, 2]  # the last batch of an epoch is short, then a new permutation
    assert [len(e) for e in expect1] == [2, 1]
    for padding, step1 in ((together.PADDING, [(0, 1, 2), (1, 2, 1)]), (1.5, [(0, 2, 2)])):
        plan = together.BatchPlan.of([Ctx(5, 4, 1), Ctx(3, 2, 2)], batch_size=2, padding=padding)
        assert plan.steps == 4 and plan.active == [2, 2, 1, 1] and plan.order == [0, 1]
        assert plan.groups == [[(0, 2, 2)], step1, [(0, 1, 1)], [(0, 1, 2)]]
        index, weight = plan.tensors(torch.device("cpu"), torch.device("cpu"))
        for s in range(4):
            rows = [r for g in range(len(plan.groups[s])) for r in plan.block(plan.step(index, s), s, g)]
            weights = [r for g in range(len(plan.groups[s])) for r in plan.block(plan.step(weight, s), s, g)]
            assert rows[0][: len(expect0[s])].tolist() == expect0[s].tolist()
            assert weights[0].tolist() == ([0.5, 0.5] if len(expect0[s]) == 2 else [1.0])
            if s < 2:  # offset by client 0's five samples
                assert rows[1][: len(expect1[s])].tolist() == (expect1[s] + 5).tolist()
        step1_weights = [w.tolist() for g in range(len(step1)) for w in plan.block(plan.step(weight, 1), 1, g)]
        assert step1_weights == ([[0.5, 0.5], [1.0]] if len(step1) == 2 else [[0.5, 0.5], [1.0, 0.0]])
        assert (plan.useful, plan.computed) == (10, 10 if len(step1) == 2 else 11)
    # the other way round, the longer client is stacked first: the clients still stepping are a prefix
    swapped = together.BatchPlan.of([Ctx(3, 2, 2), Ctx(5, 4, 1)], batch_size=2)
    assert swapped.order == [1, 0] and swapped.active == [2, 2, 1, 1] and swapped.sizes == [5, 3]


def test_the_fewest_groups_of_adjacent_clients_within_the_padding_bound():
    """One call pads every client to the largest batch; the groups are the fewest runs of adjacent clients within the
    bound, of as many the least padding; clients of equal batches (or within the bound) stay one call."""
    groups_of = together.groups_of
    assert groups_of([256, 256, 256]) == [(0, 3, 256)]
    assert groups_of([77, 70, 70, 70]) == [(0, 4, 77)]  # 21 padded of 287: within 10 %
    # one call would pad 695 of 329; two, 47 (over 32.9); three, 10 (of two, [256], [40, 30, 3] pads least)
    assert groups_of([256, 40, 30, 3]) == [(0, 1, 256), (1, 3, 40), (3, 4, 3)]
    assert groups_of([256, 40, 30, 3], padding=1.2) == [(0, 1, 256), (1, 4, 40)]
    assert groups_of([256, 40, 30, 3], padding=1.01) == [(0, 1, 256), (1, 2, 40), (2, 3, 30), (3, 4, 3)]
    assert groups_of([256, 100, 256]) == [(0, 1, 256), (1, 2, 100), (2, 3, 256)]  # adjacent only: no skipping
    assert groups_of([9, 1], padding=100.0) == [(0, 2, 9)] and groups_of([]) == []
    with pytest.raises(ValueError, match="padding 0.5"):
        groups_of([2, 1], padding=0.5)


def test_quantity_skewed_rounds_stop_where_one_by_one_stops(setup):
    """Quantity skew (clients of 70, 89, 1, 1 and 39 samples, batches of 16 and of 1: steps of several calls): over
    10 rounds the task-vector norms, which the data-free rule reads, stay within float32 rounding of one by one, and
    every rule of the study's kind (data-free at each tau and patience, validation loss) stops at the same round."""
    from fedmedbench.fl.stopping import datafree_stop, growth_rates, validation_stop

    sizes = fed.Job(spec(setup, "skew-sizes")).task.client_sizes()
    plan = together.BatchPlan.of_draws([[np.arange(16)] * 2, [np.arange(1)] * 2], [70, 1])
    assert sorted(sizes) == [1, 1, 39, 70, 89] and plan.calls == 2 * plan.steps  # 16 and 1: a call each
    one = run(spec(setup, "skew-one", rounds=10, lr=0.01))
    both = run(spec(setup, "skew-both", rounds=10, lr=0.01, batch_clients=True))
    norms = {name: [r["task_norm"] for r in result.rows] for name, result in (("one", one), ("both", both))}
    assert norms["both"] == pytest.approx(norms["one"], rel=1e-6)
    fired = 0
    for tau in (0.005, 0.01, 0.05, 0.07, 0.1, 0.125, 0.15):
        for patience in (1, 2, 3):
            stops = {name: datafree_stop(n, tau, patience) for name, n in norms.items()}
            assert stops["both"] == stops["one"], (tau, patience, growth_rates(norms["one"]))
            fired += stops["one"] is not None
        losses = {name: [r["val_loss"] for r in result.rows] for name, result in (("one", one), ("both", both))}
        assert validation_stop(losses["both"], 2, "min", tau) == validation_stop(losses["one"], 2, "min", tau)
    assert fired >= 5  # the rule stops within the rounds at several taus: the comparison is not of two Nones


def test_what_cannot_be_batched_trains_one_by_one_and_says_why(setup, monkeypatch):
    """A model with BatchNorm buffers, Adam, augmented reads: the log says why, the clients train one by one. A
    step perturbation of a method's own falls back in the round itself, bit for bit as one by one."""
    from fedmedbench.fl.methods._sgd import StepHooks
    from fedmedbench.fl.methods.fedavg import FedAvg

    said: list[str] = []
    bn = fed.Job(spec(setup, "bn", model="cnn_small", batch_clients=True))
    assert fed.with_clients_together(fed.InProcessTransport(bn), bn, said.append).__class__ is fed.InProcessTransport
    assert "buffers" in said[-1]
    own = fed.Job(spec(setup, "fedsmoo", method="fedsmoo", batch_clients=True, optimizer="adam"))
    assert fed.why_not_together(own) == "train.optimizer is adam"
    gpaf = fed.Job(spec(setup, "gpaf", method="moon", model="cnn_small", batch_clients=True))
    assert fed.why_not_together(gpaf) == "method 'moon' trains its clients one by one"
    augmented = fed.Job(dataclasses.replace(spec(setup, "aug", batch_clients=True),
                                            client_augmentation={"mode": "reference", "domains": {}, "domain_seed": 0}))
    assert "client_augmentation" in fed.why_not_together(augmented)  # each client's reads go through its own loader
    off = fed.Job(spec(setup, "off"))
    assert fed.with_clients_together(fed.InProcessTransport(off), off, said.append).__class__ is fed.InProcessTransport
    assert together.round_why_not([StepHooks(), StepHooks(extra_weight_decay=0.1)]) == "clients of different weight decays or loss weights"

    def nudge(model, xb, yb):
        return {n: torch.full_like(p, 1e-3) for n, p in model.named_parameters()}

    made: list[tuple[int, int]] = []  # (round, client) of every hooks() call: a method's hooks may move its state

    def own_hooks(self, ctx):
        made.append((ctx.rnd, ctx.pid))
        return StepHooks(perturb=nudge)

    monkeypatch.setattr(FedAvg, "hooks", own_hooks)
    one = run(spec(setup, "own-one", rounds=2))
    made_one, made[:] = list(made), []
    both = run(spec(setup, "own-both", rounds=2, batch_clients=True))
    assert made == made_one and len(made) == len(set(made)) == 8  # once per client and round, as one by one
    for k, a in one.arrays.items():
        assert torch.equal(torch.as_tensor(both.arrays[k]), torch.as_tensor(a)), k


def test_batch_clients_is_in_the_run_hash_only_when_set(setup):
    assert spec(setup, "h").run_hash() != spec(setup, "h", batch_clients=True).run_hash()
    assert "batch_clients" not in spec(setup, "h").train


def test_the_step_count_is_the_longest_clients(setup):
    s = spec(setup, "steps", batch_clients=True, rounds=1)
    job = fed.Job(s)
    sizes = job.task.client_sizes()
    calls = collections.Counter()
    original = together.to_float

    def counting(*a, **kw):
        calls["steps"] += 1
        return original(*a, **kw)

    together.to_float = counting
    try:
        steps = {p: fed.Federation(s, log=lambda m: None).steps(p) for p in range(4)}
        fed.clients_train_together(job, steps, 1, fed.Federation(s, log=lambda m: None).initial_state().arrays)
    finally:
        together.to_float = original
    assert calls["steps"] == max(steps.values()) == max(2 * int(np.ceil(n / 16)) for n in sizes[:4])


def test_a_non_finite_loss_names_the_client_and_the_step(setup):
    """lr 1e6 without clipping: the first client whose loss turns non-finite is named with its round and step,
    as one by one (train.on_nonfinite: error)."""
    from fedmedbench.fl.training import NonFiniteLossError

    s = spec(setup, "nan", batch_clients=True, rounds=1, lr=1e6, grad_clip=None)
    f = fed.Federation(s, log=lambda m: None)
    with pytest.raises(NonFiniteLossError, match=r"^client \d+: non-finite training loss .* at round 1, step \d+"):
        f.run(fed.with_clients_together(fed.InProcessTransport(f.job), f.job, log=lambda m: None))


def test_the_engine_trains_clients_together_through_its_flower_grid(setup):
    """engine.run (the Flower inline grid, the run's checkpoint, evaluation through the clients' app) with
    train.batch_clients gives the weights of the batched rounds, and says nothing about one by one."""
    from pathlib import Path

    from fedmedbench.fl.engine import flower as engine

    s = spec(setup, "engine-both", method="scaffold", batch_clients=True, rounds=2)
    said: list[str] = []
    engine.run(s, log=said.append)
    model = torch.load(Path(s.run_dir) / "model.pt", weights_only=True)
    direct = run(spec(setup, "direct-both", method="scaffold", batch_clients=True, rounds=2))
    for k, a in direct.arrays.items():
        assert torch.equal(model[k].cpu(), torch.as_tensor(a).cpu()), k
    assert not [m for m in said if "one by one" in m]


def test_a_client_whose_steps_are_done_is_not_computed(setup):
    """One client of 12 steps and three of one (quantity skew), trained together: the stepping clients are a
    prefix of the stack and only they are computed, so the round's arithmetic is far below that of all four
    clients taking 12 steps (padding every client to the longest, as a mask would, costs the same as that)."""
    from torch.utils.flop_counter import FlopCounterMode

    s = spec(setup, "flops", batch_clients=True, rounds=1)
    job = fed.Job(s)
    transport = fed.with_clients_together(fed.InProcessTransport(job), job, log=lambda m: None)
    arrays = fed.Federation(s, log=lambda m: None).initial_state().arrays
    flops = {}
    # clients of 70, 89, 1 and 39 samples: batches of 16, 16, 1 and 16
    for name, steps in (("skewed", {1: 12, 0: 1, 2: 1, 4: 1}), ("all 12", {1: 12, 0: 12, 2: 12, 4: 12})):
        transport.train(1, steps, arrays, {})  # first use: data loaded, model built
        with FlopCounterMode(display=False) as counter:
            transport.train(1, steps, arrays, {})
        flops[name] = counter.get_total_flops()
    # 15 client-steps of 48 (the counter's figures for batched convolutions are not per sample: a bound, not 15/48)
    assert flops["skewed"] <= 0.5 * flops["all 12"], flops


def test_clients_together_in_bfloat16_autocast_follow_one_by_one(setup):
    """train.autocast: bf16 (an option) applies in the batched step too: its weights leave fp32's by far more than
    float32 rounding, and stay within bfloat16's precision of one-by-one training in bf16."""
    def gap(a, b) -> float:
        return max(float((torch.as_tensor(x) - torch.as_tensor(b.arrays[k])).abs().max()) for k, x in a.arrays.items())

    bf_one = run(spec(setup, "bf-one", rounds=1, autocast="bf16"))
    bf_both = run(spec(setup, "bf-both", batch_clients=True, rounds=1, autocast="bf16"))
    fp_both = run(spec(setup, "fp-both", batch_clients=True, rounds=1))
    fp_one = run(spec(setup, "fp-one", rounds=1))
    assert gap(fp_both, fp_one) < 1e-6  # float32: reordered sums
    assert gap(bf_both, fp_both) > 10 * gap(fp_both, fp_one)  # the batched step ran in bf16
    assert gap(bf_both, bf_one) < 1e-3  # about bf16's own effect here (1e-4), not more


def test_a_round_of_undeclared_or_mixed_step_hooks_is_not_batched():
    """A perturbation that is a plain function, a callback after every step that is not the perturbation's own,
    clients of two kinds of perturbation: each named; a declared perturbation and its own callback join a batch."""
    from fedmedbench.fl.methods._perturb import FixedPerturbation, SamAscent
    from fedmedbench.fl.methods._sgd import StepHooks
    from fedmedbench.fl.methods.fedwmsam import MomentumGuided

    guided = MomentumGuided(0.1, "vector", {}, {}, {})
    assert together.round_why_not([StepHooks(perturb=guided, after_step=guided.advance)] * 2) is None
    assert together.round_why_not([StepHooks(perturb=lambda m, x, y: None)]) == "a weight perturbation of the method's own"
    assert together.round_why_not([StepHooks(after_step=lambda: None)]) == "a callback after every step"
    other = MomentumGuided(0.1, "vector", {}, {}, {})
    assert together.round_why_not([StepHooks(perturb=guided, after_step=other.advance)]) == "a callback after every step"
    mixed = [StepHooks(perturb=SamAscent(0.05)), StepHooks(perturb=FixedPerturbation({}))]
    assert together.round_why_not(mixed) == "clients of different perturbations"
    assert together.round_why_not([StepHooks(perturb=SamAscent(0.05)), StepHooks()]) is None


def test_a_round_whose_perturbations_one_batched_form_cannot_take_is_named():
    """The batched forms of FedSMOO and FedWMSAM read rho (and the form) off the first client and need every
    client's perturbation; SAM's ascent takes a rho per client and FedLESAM's fixed e may be absent on a client."""
    from fedmedbench.fl.methods._perturb import FixedPerturbation, Perturbation, SamAscent, batch_why_not
    from fedmedbench.fl.methods.fedsmoo import DualAscent
    from fedmedbench.fl.methods.fedwmsam import MomentumGuided

    def dual(rho):
        return DualAscent(rho, {}, {})

    def guided(rho, form="vector"):
        return MomentumGuided(rho, form, {}, {}, {})

    assert batch_why_not([dual(0.1), dual(0.1)]) is None
    assert batch_why_not([dual(0.1), dual(0.2)]) == "clients of different DualAscent rho"
    assert "without a DualAscent perturbation" in batch_why_not([dual(0.1), None])
    assert "without a DualAscent perturbation" in batch_why_not([None, dual(0.1)])
    assert batch_why_not([guided(-0.1), guided(-0.1)]) is None
    assert batch_why_not([guided(-0.1), guided(0.1)]) == "clients of different MomentumGuided rho"
    assert batch_why_not([guided(-0.1), guided(-0.1, "reference")]) == "clients of different MomentumGuided form"
    assert "without a MomentumGuided perturbation" in batch_why_not([guided(-0.1), None])
    assert batch_why_not([SamAscent(0.05), SamAscent(0.1), None]) is None
    assert batch_why_not([None, FixedPerturbation({}), None]) is None
    assert batch_why_not([None, None]) is None
    assert batch_why_not([SamAscent(0.05), dual(0.05)]) == "clients of different perturbations"

    class Scaled(SamAscent):  # a subclass is another class: its batched form may read other settings
        pass

    class OwnAscent(Perturbation):  # a perturbation of a method's own, declaring what its batched form shares
        shared = ("scale",)

        def __init__(self, scale: float) -> None:
            self.scale = scale

    assert batch_why_not([SamAscent(0.05), Scaled(0.05)]) == "clients of different perturbations"
    assert batch_why_not([OwnAscent(1.0), None, OwnAscent(1.0)]) is None
    assert batch_why_not([OwnAscent(1.0), OwnAscent(2.0)]) == "clients of different OwnAscent scale"
    from fedmedbench.fl.methods._sgd import StepHooks

    assert together.round_why_not([StepHooks(perturb=dual(0.1)), StepHooks()]).startswith("a client without")
    assert together.round_why_not([StepHooks(perturb=dual(0.1)), StepHooks(perturb=dual(0.1))]) is None


class UnusedParamNet(LayerNormNet):
    """LayerNormNet with a trainable parameter its forward never reads."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__(in_channels, num_classes)
        self.spare = nn.Parameter(torch.zeros(3))


if "unused_param_test" not in MODELS:
    register_model("unused_param_test")(lambda in_channels, num_classes, image_size: UnusedParamNet(in_channels,
                                                                                                    num_classes))


def test_a_parameter_without_a_gradient_stops_clients_together_with_a_message(setup):
    """One by one, SGD skips a parameter the forward never reads; stacked, it has no gradient row: the run stops
    naming the parameter and the setting to change, instead of failing inside the step's arithmetic."""
    run(spec(setup, "spare-one", model="unused_param_test", rounds=1))  # one by one: trains
    with pytest.raises(ValueError, match=r"parameter 'spare' gets no gradient.*batch_clients: false"):
        run(spec(setup, "spare-both", model="unused_param_test", batch_clients=True, rounds=1))


def test_a_model_that_draws_in_training_trains_one_by_one_and_says_why():
    """Dropout or drop path in training draws per sample, which vmap over stacked clients cannot: such a model is
    refused up front (rate 0 draws nothing and is let through)."""
    import timm

    from fedmedbench.fl.api import TrainConfig

    cfg = TrainConfig(rounds=1, local_epochs=1, batch_size=8, lr=0.1)
    dims = {"dims": (8, 16, 32, 64), "num_classes": 3}
    assert together.model_why_not(timm.create_model("convnextv2_atto", **dims), cfg) is None
    assert "draws at random" in together.model_why_not(timm.create_model("convnextv2_atto", drop_path_rate=0.1, **dims), cfg)
    assert "draws at random" in together.model_why_not(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2)), cfg)
    assert together.model_why_not(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)), cfg) is None


def test_a_batched_perturbation_that_would_skip_its_clients_callback_is_an_error(setup):
    """A perturbation with its own per-step callback whose batched form does not override after_step: trained
    together, the callback would never run. The round stops with the class to mend instead."""
    from fedmedbench.fl.methods._perturb import BatchedPerturbation, Perturbation
    from fedmedbench.fl.methods._sgd import StepHooks

    class Counting(Perturbation):
        def __init__(self) -> None:
            self.steps = 0

        def advance(self) -> None:
            self.steps += 1

        @classmethod
        def batched(cls, perturbs, stack):
            return Silent()

    class Silent(BatchedPerturbation):
        def e(self, weights, grads, n):
            return None

    f = fed.Federation(spec(setup, "silent", batch_clients=True, rounds=1), log=lambda m: None)
    model = f.job.resident
    arrays = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ctxs = [fed._client_context(f.job, pid, 1, arrays, 2, model=model)[0] for pid in (0, 1)]
    perturbs = [Counting(), Counting()]
    hooks = [StepHooks(perturb=p, after_step=p.advance) for p in perturbs]
    assert together.round_why_not(hooks) is None  # the callback is the perturbation's own: let through ...
    with pytest.raises(TypeError, match=r"Counting.batched gives a Silent, which does not override "
                                        r"BatchedPerturbation.after_step"):
        together.train_together(ctxs, hooks)  # ... and stopped before a step skips it


def test_a_round_that_falls_back_to_one_by_one_says_why_once_in_the_log(setup, monkeypatch):
    """Hooks that the batched step cannot take train the round one by one: the run's log says so, once a reason."""
    from fedmedbench.fl.methods._sgd import StepHooks
    from fedmedbench.fl.methods.fedavg import FedAvg

    def nudge(model, xb, yb):
        return {n: torch.full_like(p, 1e-3) for n, p in model.named_parameters()}

    monkeypatch.setattr(FedAvg, "hooks", lambda self, ctx: StepHooks(perturb=nudge))
    said: list[str] = []
    f = fed.Federation(spec(setup, "said", batch_clients=True, rounds=3), log=said.append)
    f.run(fed.with_clients_together(fed.InProcessTransport(f.job), f.job, log=said.append))
    lines = [m for m in said if "one by one" in m]
    assert lines == ["train.batch_clients: a round's clients trained one by one (a weight perturbation of the "
                     "method's own)"], said
