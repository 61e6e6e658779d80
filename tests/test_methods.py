"""Defining properties of the FL optimizers, on tiny problems (no Flower)."""

from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from fedmedbench.fl.api import ClientContext, ClientData, ClientResult, ServerContext, TrainConfig
from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.methods._sgd import flat_norm, sam_perturbation
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.training import to_float

N_CLASSES = 3


def tiny_model(seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, N_CLASSES))


def tiny_data(seed=0, n=24) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 1, 2, 2), generator=g, dtype=torch.uint8)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    return ClientData(x, y, x[:4], y[:4], x[:4], y[:4])


def train_cfg(**kw) -> TrainConfig:
    base = dict(rounds=5, local_epochs=1, batch_size=8, lr=0.1, momentum=0.0, weight_decay=1e-3, grad_clip=10.0)
    return TrainConfig(**{**base, **kw})


def context(model=None, state=None, broadcast=None, steps=3, rnd=1, data=None, sizes=(24, 24), **cfg) -> ClientContext:
    model = model or tiny_model()
    return ClientContext(pid=0, rnd=rnd, model=model, data=data or tiny_data(), train=train_cfg(**cfg),
                         device=torch.device("cpu"), generator=torch.Generator().manual_seed(7),
                         state=state if state is not None else {}, steps=steps,
                         global_arrays=model_arrays(model), broadcast=broadcast or {}, client_sizes=lambda: list(sizes))


def fit(method_name, params=None, **ctx_kw):
    ctx = context(**ctx_kw)
    result = get_method(method_name, params).client_fit(ctx)
    return result, ctx


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def server_ctx(global_arrays, results, num_clients=4, state=None, broadcast=None, **cfg) -> ServerContext:
    return ServerContext(rnd=1, global_arrays=global_arrays, results=results, pids=list(range(len(results))),
                         state=state if state is not None else {}, num_clients=num_clients, device=torch.device("cpu"),
                         train=train_cfg(**cfg), new_model=tiny_model, broadcast=broadcast if broadcast is not None else {})


# ---------------------------------------------------------------- client-side properties


def test_fedprox_mu0_equals_fedavg_bit_for_bit():
    a, _ = fit("fedavg")
    b, _ = fit("fedprox", {"mu": 0.0})
    assert same(a.arrays, b.arrays)
    c, _ = fit("fedprox", {"mu": 0.5})
    assert not same(a.arrays, c.arrays)


def test_fedprox_gradient_is_ce_plus_mu_times_distance():
    """One SGD step from a point off the anchor: theta' = theta - lr (g + wd theta + mu (theta - theta_g))."""
    model = tiny_model()
    anchor = model_arrays(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3)
    ctx = context(model=copy.deepcopy(model), steps=1, weight_decay=0.0, grad_clip=None)
    ctx.global_arrays = anchor
    mu, lr = 0.7, 0.1
    get_method("fedprox", {"mu": mu}).client_fit(ctx)
    idx = torch.randperm(24, generator=torch.Generator().manual_seed(7))[:8]
    data = tiny_data()
    ref = copy.deepcopy(model)
    nn.functional.cross_entropy(ref(to_float(data.train_x[idx], torch.device("cpu"))), data.train_y[idx]).backward()
    for (name, p), (_, q) in zip(ref.named_parameters(), ctx.model.named_parameters(), strict=True):
        expected = p - lr * (p.grad + mu * (p - anchor[name]))
        torch.testing.assert_close(q, expected.detach(), rtol=1e-5, atol=1e-6)


def test_scaffold_control_variate_update():
    c = {n: torch.full(p.shape, 0.01) for n, p in tiny_model().named_parameters()}
    c_i_old = {n: torch.full(p.shape, -0.02) for n, p in tiny_model().named_parameters()}
    result, ctx = fit("scaffold", broadcast={"c": c}, state={"c_i": {k: v.clone() for k, v in c_i_old.items()}},
                      steps=3, lr=0.1)
    k_lr = 3 * 0.1
    for n, p in ctx.model.named_parameters():
        expected = c_i_old[n] - c[n] + (ctx.global_arrays[n] - p.detach()) / k_lr
        torch.testing.assert_close(ctx.state["c_i"][n], expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result.extras["delta_c"][n], expected - c_i_old[n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["scaffold", "fedgamma", "fedwmsam"])
def test_local_iterations_reference_uses_client0_size_per_client_its_own_steps(method):
    """K = E * n_0 / B for every client (server/SCAFFOLD.py) vs the client's own step count."""
    from fedmedbench.fl.methods._sgd import local_iterations

    # a client of 24 examples (3 steps of 8) in a federation whose client 0 holds 60 examples
    ctx = context(steps=3, sizes=(60, 24), local_epochs=2, batch_size=8)
    assert local_iterations(ctx, "reference") == pytest.approx(2 * 60 / 8)
    assert local_iterations(ctx, "per_client") == 3
    c_i_old = {n: torch.zeros(p.shape) for n, p in tiny_model().named_parameters()}
    results = {}
    for form in ("reference", "per_client"):
        params = {"local_iterations": form, **({"rho": 0.0} if method != "scaffold" else {})}
        r, c = fit(method, params, steps=3, sizes=(60, 24), lr=0.1, batch_size=8, local_epochs=2,
                   state={"c_i": {k: v.clone() for k, v in c_i_old.items()}})
        results[form] = (r, c)
    ref, per = results["reference"][1].state["c_i"], results["per_client"][1].state["c_i"]
    for n in ref:  # c_i+ = -(theta_i - theta_g) / (K lr): the two forms differ by K_ref / steps = 15 / 3
        torch.testing.assert_close(per[n], ref[n] * (15 / 3), rtol=1e-5, atol=1e-7)
    if method == "fedwmsam":
        assert results["reference"][0].metrics["k_lr"] == pytest.approx(15 * 0.1)
    with pytest.raises(ValueError, match="local_iterations"):
        get_method(method, {"local_iterations": "textbook"})


def test_scaffold_with_equal_controls_is_fedavg_and_server_updates_c():
    a, _ = fit("fedavg")
    b, _ = fit("scaffold")  # c = c_i = 0: no correction
    assert same(a.arrays, b.arrays)
    g = model_arrays(tiny_model())
    dcs = [{k: torch.full_like(v, float(i + 1)) for k, v in g.items() if "weight" in k or "bias" in k} for i in range(2)]
    results = [ClientResult(arrays=g, num_examples=10, extras={"delta_c": d}) for d in dcs]
    ctx = server_ctx(g, results, num_clients=4, broadcast={})
    get_method("scaffold").aggregate(ctx)
    for v in ctx.broadcast["c"].values():
        np.testing.assert_allclose(v, (1 + 2) / 4)  # c += sum(delta_c) / N


def test_sam_ascent_step_on_a_quadratic():
    """For f(w) = 1/2 w^T A w the SAM ascent is rho * g/||g|| with g = A w."""
    a = torch.diag(torch.tensor([1.0, 4.0, 9.0]))
    w = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    (0.5 * w @ a @ w).backward()
    e = sam_perturbation({"w": w.grad}, rho=0.05)["w"]
    g = a @ w.detach()
    torch.testing.assert_close(e, 0.05 * g / g.norm(), rtol=1e-6, atol=1e-7)
    assert math.isclose(float(e.norm()), 0.05, rel_tol=1e-5)


def test_fedsam_step_uses_gradient_at_perturbed_point():
    model = tiny_model()
    ctx = context(model=copy.deepcopy(model), steps=1, weight_decay=0.0, grad_clip=None)
    get_method("fedsam", {"rho": 0.2}).client_fit(ctx)
    data = tiny_data()
    idx = torch.randperm(24, generator=torch.Generator().manual_seed(7))[:8]
    xb, yb = to_float(data.train_x[idx], torch.device("cpu")), data.train_y[idx]
    ref = copy.deepcopy(model)
    nn.functional.cross_entropy(ref(xb), yb).backward()
    g = {n: p.grad.clone() for n, p in ref.named_parameters()}
    e = sam_perturbation(g, 0.2)
    pert = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in pert.named_parameters():
            p.add_(e[n])
    nn.functional.cross_entropy(pert(xb), yb).backward()
    for (_, p), (_, q), (_, pp) in zip(model.named_parameters(), ctx.model.named_parameters(), pert.named_parameters(), strict=True):
        torch.testing.assert_close(q, (p - 0.1 * pp.grad).detach(), rtol=1e-5, atol=1e-6)
    plain, _ = fit("fedavg", steps=1, weight_decay=0.0, grad_clip=None)
    assert not same(plain.arrays, model_arrays(ctx.model))


def test_rho0_reduces_sam_family_to_their_base():
    assert same(fit("fedsam", {"rho": 0.0})[0].arrays, fit("fedavg")[0].arrays)
    assert same(fit("fedgamma", {"rho": 0.0})[0].arrays, fit("scaffold")[0].arrays)
    assert same(fit("fedspeed", {"rho": 0.0, "lamb": 0.1})[0].arrays, fit("feddyn", {"lamb": 0.1})[0].arrays)
    assert not same(fit("fedspeed", {"rho": 0.1})[0].arrays, fit("feddyn")[0].arrays)


def test_feddyn_client_accumulates_h_and_uses_it():
    r1, ctx1 = fit("feddyn", {"lamb": 0.1})
    d1 = {n: p.detach() - ctx1.global_arrays[n] for n, p in ctx1.model.named_parameters()}
    for n in d1:
        torch.testing.assert_close(ctx1.state["h_i"][n], d1[n])
    r2, _ = fit("feddyn", {"lamb": 0.1}, state={"h_i": {k: v.clone() for k, v in ctx1.state["h_i"].items()}})
    assert not same(r1.arrays, r2.arrays)  # the dual term changes the next local update


def test_feddyn_server_state_h_and_update():
    g = model_arrays(tiny_model(0))
    locals_ = [model_arrays(tiny_model(s)) for s in (1, 2)]
    results = [ClientResult(arrays=a, num_examples=10) for a in locals_]
    ctx = server_ctx(g, results, num_clients=5, aggregation="uniform")
    new = get_method("feddyn").aggregate(ctx)
    for k in g:
        h = sum(a[k].double() - g[k] for a in locals_) / 5
        np.testing.assert_allclose(ctx.state["h"][k].numpy(), h, rtol=1e-6)
        np.testing.assert_allclose(new[k], (locals_[0][k] + locals_[1][k]) / 2 + h, rtol=1e-5, atol=1e-6)
    # the state accumulates over rounds
    ctx2 = server_ctx(new, results, num_clients=5, state=ctx.state, aggregation="uniform")
    get_method("feddyn").aggregate(ctx2)
    k = next(iter(g))
    h1 = sum(a[k].double() - g[k] for a in locals_) / 5
    h2 = h1 + sum(a[k].double() - new[k] for a in locals_) / 5
    np.testing.assert_allclose(ctx2.state["h"][k].numpy(), h2, rtol=1e-5, atol=1e-6)


def test_fedsmoo_dual_and_global_correction():
    result, ctx = fit("fedsmoo", {"rho": 0.1, "lamb": 0.1}, steps=1)
    mu = ctx.state["mu_i"]
    # one step from mu = 0, s = 0: mu = e, the SAM perturbation of norm rho
    assert math.isclose(float(flat_norm(mu)), 0.1, rel_tol=1e-4)
    g = model_arrays(tiny_model())
    results = [ClientResult(arrays=g, num_examples=10, extras={"mu": result.extras["mu"]}),
               ClientResult(arrays=g, num_examples=10, extras={"mu": {k: 3 * v for k, v in result.extras["mu"].items()}})]
    sctx = server_ctx(g, results)
    get_method("fedsmoo", {"rho": 0.1}).aggregate(sctx)
    s = sctx.broadcast["s"]
    assert math.isclose(float(np.sqrt(sum((v.double() ** 2).sum() for v in s.values()))), 0.1, rel_tol=1e-4)
    cos = sum(float((s[k] * result.extras["mu"][k]).sum()) for k in s) / (0.1 * float(flat_norm(mu)))
    assert cos > 0.999  # s points along the mean dual


def test_fedlesam_first_participation_plain_then_global_direction():
    first, ctx = fit("fedlesam", {"rho": 0.1, "estimate": "previous_global"})
    assert same(first.arrays, fit("fedavg")[0].arrays)  # no previous global model: no perturbation
    prev = ctx.state["prev_global"]
    # next participation: the global model moved; perturbation = rho * (prev - now)/||prev - now||
    moved = tiny_model()
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05)
    second, _ = fit("fedlesam", {"rho": 0.1, "estimate": "previous_global"}, model=moved, state={"prev_global": prev})
    plain, _ = fit("fedavg", model=copy.deepcopy(moved))
    assert not same(second.arrays, plain.arrays)
    zero, _ = fit("fedlesam", {"rho": 0.0}, model=copy.deepcopy(moved), state={"prev_global": prev})
    assert same(zero.arrays, plain.arrays)


def test_fedlesam_reference_estimate_is_the_negated_last_global_update():
    """Default (server/FedLESAM.py, optimizer/LESAM.py): the direction is -u, u the last global update."""
    assert get_method("fedlesam").estimate == "last_update"
    first, _ = fit("fedlesam", {"rho": 0.1})
    assert same(first.arrays, fit("fedavg")[0].arrays)  # round 1: no update broadcast yet, no perturbation
    u = {n: torch.full(p.shape, 0.02) for n, p in tiny_model().named_parameters()}
    m = get_method("fedlesam", {"rho": 0.1})
    ctx = context(broadcast={"last_update": u})
    d = m.direction(ctx)
    for n in u:
        torch.testing.assert_close(d[n], -u[n])
    # the server broadcasts new - old as the next round's update
    g = model_arrays(tiny_model(0))
    loc = model_arrays(tiny_model(1))
    sctx = server_ctx(g, [ClientResult(arrays=loc, num_examples=10)], aggregation="uniform")
    new = get_method("fedlesam").aggregate(sctx)
    for k in u:
        np.testing.assert_allclose(sctx.broadcast["last_update"][k], new[k] - g[k], rtol=1e-5, atol=1e-7)


def test_indexed_perturbation_moves_each_tensor_by_one_entry_of_the_flat_direction():
    """Tensor j moves as a whole by rho * v[j] / sum_k |v[k]|, v the flat direction, k < P tensors."""
    from fedmedbench.fl.methods._sgd import indexed_perturbation

    d = {"a": torch.tensor([[1.0, -2.0], [3.0, 4.0]]), "b": torch.tensor([5.0, 6.0, 7.0])}
    e = indexed_perturbation((d[n] for n in ("a", "b")), ["a", "b"], 0.3)
    assert e["a"].dim() == 0 and math.isclose(float(e["a"]), 0.3 * 1 / 3, rel_tol=1e-6)
    assert math.isclose(float(e["b"]), 0.3 * -2 / 3, rel_tol=1e-6)
    # the leading entries may span tensors: v = (1, 2, 3) for three tensors
    d = {"a": torch.tensor([1.0]), "b": torch.tensor([2.0, 3.0]), "c": torch.tensor([4.0])}
    e = indexed_perturbation((d[n] for n in "abc"), list("abc"), 0.6)
    assert [round(float(e[n]), 6) for n in "abc"] == [0.1, 0.2, 0.3]
    zero = indexed_perturbation((torch.zeros(3) for _ in range(1)), ["a", "b"], 0.6)
    assert float(zero["a"]) == 0.0 == float(zero["b"])


def test_leading_entries_per_row_are_each_rows_own():
    """Stacked pieces (rows, ...): row r's leading entries are those of row r's own pieces (the batched
    FedWMSAM reference form), spanning tensors; too few entries are refused for the stack as for one."""
    from fedmedbench.fl.methods._sgd import leading_entries

    pieces = [torch.tensor([[1.0], [-1.0]]), torch.tensor([[[2.0, 3.0]], [[-2.0, -3.0]]]), torch.tensor([[4.0], [9.0]])]
    v = leading_entries(pieces, 3, rows=2)
    assert v.tolist() == [[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]]
    assert [leading_entries((t[r] for t in pieces), 3).tolist() for r in range(2)] == v.tolist()
    with pytest.raises(ValueError, match="1 entries for 3 parameter tensors"):
        leading_entries(pieces[:1], 3, rows=2)


def _reference_indexed_shift(params: list[torch.Tensor], flat: torch.Tensor, rho: float) -> list[torch.Tensor]:
    """optimizer/LESAM.py / WMSAM.py first_step: e_w = -flat[idx] * rho / (sum |flat[idx]| + 1e-7) per tensor idx."""
    norm = sum(flat[i].abs() for i in range(len(params)))
    return [p + (-flat[i] * rho / (norm + 1e-7)) for i, p in enumerate(params)]


def _step_from(model: nn.Module, shifted: list[torch.Tensor], xb, yb, lr: float) -> list[torch.Tensor]:
    """theta - lr * grad CE at the shifted weights (plain SGD, no decay, no clipping)."""
    pert = copy.deepcopy(model)
    with torch.no_grad():
        for p, q in zip(pert.parameters(), shifted, strict=True):
            p.copy_(q)
    nn.functional.cross_entropy(pert(xb), yb).backward()
    return [(p - lr * q.grad).detach() for p, q in zip(model.parameters(), pert.parameters(), strict=True)]


@pytest.mark.parametrize("form", ["reference", "vector"])
def test_fedlesam_perturbation_forms(form):
    """reference: each tensor shifted by a scalar -rho u[j] / sum_k |u[k]|; vector: e = -rho u/||u||."""
    model = tiny_model()
    flat = torch.linspace(-0.3, 0.5, sum(p.numel() for p in model.parameters()))
    u, i = {}, 0
    for n, p in model.named_parameters():
        u[n] = flat[i:i + p.numel()].reshape(p.shape).clone()
        i += p.numel()
    params = {"rho": 0.5, **({} if form == "reference" else {"perturbation_form": form})}
    result, _ = fit("fedlesam", params, model=copy.deepcopy(model), broadcast={"last_update": u}, steps=1,
                    weight_decay=0.0, grad_clip=None)
    idx = torch.randperm(24, generator=torch.Generator().manual_seed(7))[:8]
    data = tiny_data()
    xb, yb = to_float(data.train_x[idx], torch.device("cpu")), data.train_y[idx]
    theta = [p.detach() for p in model.parameters()]
    if form == "reference":
        shifted = _reference_indexed_shift(theta, flat, 0.5)
    else:
        shifted = [p - 0.5 * u[n] / flat.norm() for (n, _), p in zip(model.named_parameters(), theta, strict=True)]
    expected = _step_from(model, shifted, xb, yb, lr=0.1)
    for (n, _), q in zip(model.named_parameters(), expected, strict=True):
        torch.testing.assert_close(result.arrays[n], q, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="perturbation_form"):
        get_method("fedlesam", {"perturbation_form": "elementwise"})


@pytest.mark.parametrize("form,sign", [("reference", -1), ("vector", -1), ("reference", 1), ("vector", 1)])
def test_fedwmsam_perturbation_forms_follow_the_moving_target(form, sign):
    """Two steps, alpha -> 1 and m = 0 (plain CE): step 1 is unperturbed (t = theta); after it the target
    moves by m_i = 0, so step 2 is perturbed along t - theta_1 = theta_0 - theta_1: per tensor by
    sign rho d[j] / sum_k |d[k]| (reference, optimizer/WMSAM.py) or by sign rho d/||d|| (vector);
    sign -1 is the public code's, +1 the README formula's."""
    model = tiny_model()
    params = {"rho": 0.5, **({} if form == "reference" else {"perturbation_form": form}),
              **({} if sign == -1 else {"perturbation_sign": sign})}
    result, _ = fit("fedwmsam", params, model=copy.deepcopy(model), steps=2, batch_size=24, weight_decay=0.0,
                    grad_clip=None, broadcast={"alpha": {"alpha": torch.tensor(1 - 1e-12, dtype=torch.float64)}})
    data = tiny_data()
    xb, yb = to_float(data.train_x, torch.device("cpu")), data.train_y  # one full batch per step
    theta0 = [p.detach() for p in model.parameters()]
    theta1 = _step_from(model, theta0, xb, yb, lr=0.1)
    d = [a - b for a, b in zip(theta0, theta1, strict=True)]
    flat = torch.cat([t.reshape(-1) for t in d])
    m1 = copy.deepcopy(model)
    with torch.no_grad():
        for p, q in zip(m1.parameters(), theta1, strict=True):
            p.copy_(q)
    if form == "reference":
        shifted = _reference_indexed_shift(theta1, flat, -sign * 0.5)
    else:
        shifted = [p + sign * 0.5 * t / flat.norm() for p, t in zip(theta1, d, strict=True)]
    expected = _step_from(m1, shifted, xb, yb, lr=0.1)
    for (n, _), q in zip(model.named_parameters(), expected, strict=True):
        torch.testing.assert_close(result.arrays[n], q, rtol=1e-4, atol=1e-6)


def test_fedwmsam_server_momentum_alpha_and_client_weighting():
    g = model_arrays(tiny_model(0))
    loc = [model_arrays(tiny_model(s)) for s in (1, 2)]
    dcs = {k: torch.zeros_like(v) for k, v in g.items()}
    results = [ClientResult(arrays=a, num_examples=10, metrics={"k_lr": 0.3}, extras={"delta_c": dcs}) for a in loc]
    ctx = server_ctx(g, results, aggregation="uniform", lr_decay=0.998)
    new = get_method("fedwmsam", {"alpha": 0.1}).aggregate(ctx)
    for k in g:
        mean_delta = (loc[0][k].double() + loc[1][k] - 2 * g[k]) / 2
        np.testing.assert_allclose(ctx.broadcast["momentum"][k], -mean_delta / 0.3 * 0.998, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new[k], g[k] + mean_delta, rtol=1e-5, atol=1e-6)
    # first round: the momentum is zero, so the reference's cosine_similarity returns 0 (no +1);
    # the mean 0 is clipped to 0.1 -> alpha = 0.99 * 0.1 + 0.01 * 0.1
    assert math.isclose(float(ctx.broadcast["alpha"]["alpha"]), 0.99 * 0.1 + 0.01 * 0.1)
    # the reference's own values: alpha 0.001 -> 0.99 * 0.001 + 0.001 = 0.00199
    ctx0 = server_ctx(g, results, aggregation="uniform", lr_decay=0.998)
    get_method("fedwmsam", {"alpha": 0.001}).aggregate(ctx0)
    assert math.isclose(float(ctx0.broadcast["alpha"]["alpha"]), 0.00199)
    # next round: v_i = 1 + cos(Delta_i, m); Delta_i = -m gives v = 0 -> clipped to 0.1 again,
    # Delta_i = m gives v = 2 -> clipped to 0.9
    from fedmedbench.fl.methods.fedwmsam import similarity

    m = np.array([1.0, 2.0, -1.0])
    assert similarity(m, m) == pytest.approx(2.0) and similarity(-m, m) == pytest.approx(0.0)
    assert similarity(m, None) == 0.0 and similarity(np.zeros(3), m) == 0.0
    assert similarity(np.array([2.0, -1.0, 0.0]), m) == pytest.approx(1.0)  # orthogonal
    # client: with zero momentum and alpha in the broadcast the CE gradient is scaled by alpha
    a1, _ = fit("fedwmsam", {"rho": 0.0}, broadcast={"alpha": {"alpha": torch.tensor(1 - 1e-9, dtype=torch.float64)}}, momentum=0.0)
    a2, _ = fit("fedwmsam", {"rho": 0.0}, broadcast={"alpha": {"alpha": torch.tensor(0.5, dtype=torch.float64)}})
    plain, _ = fit("fedavg")
    diff = lambda r: sum(float((r.arrays[k] - plain.arrays[k]).abs().sum()) for k in plain.arrays)  # noqa: E731
    assert diff(a1) < 1e-5 < diff(a2)


def test_fedwmsam_alpha_after_a_nan_update_clips_to_the_floor_as_the_reference():
    """server/FedWMSAM.py:42-43: alpha = 0.99 alpha + 0.01 max(0.1, min([mean v, 0.9])); Python's min keeps
    the NaN it starts from and max then keeps 0.1, so a client whose update is NaN (v_i = NaN) moves alpha
    to 0.99 alpha + 0.01 * 0.1, not to NaN as np.clip would."""
    from fedmedbench.fl.methods.fedwmsam import clipped

    assert max(0.1, min([float("nan"), 0.9])) == 0.1 and math.isnan(float(np.clip(float("nan"), 0.1, 0.9)))
    assert clipped(float("nan")) == 0.1 and clipped(0.5) == 0.5 and clipped(2.0) == 0.9 and clipped(0.0) == 0.1
    assert clipped(float("inf")) == 0.9 and clipped(-float("inf")) == 0.1
    g = model_arrays(tiny_model(0))
    good = model_arrays(tiny_model(1))
    bad = {k: torch.full_like(v, math.nan) for k, v in g.items()}
    dcs = {k: torch.zeros_like(v) for k, v in g.items()}
    results = [ClientResult(arrays=a, num_examples=10, metrics={"k_lr": 0.3}, extras={"delta_c": dcs}) for a in (good, bad)]
    momentum = {k: torch.full_like(v, 0.01) for k, v in g.items()}  # non-zero: v_i = 1 + cos, NaN for the NaN update
    ctx = server_ctx(g, results, aggregation="uniform", broadcast={"momentum": momentum, "alpha": {"alpha": torch.tensor(0.3, dtype=torch.float64)}})
    get_method("fedwmsam").aggregate(ctx)
    assert math.isclose(float(ctx.broadcast["alpha"]["alpha"]), 0.99 * 0.3 + 0.01 * 0.1)


# ---------------------------------------------------------------- the Method hooks of the base client step


def hook_fit(extra=None, correction=None, **cfg) -> dict:
    """The base ``Method.client_fit`` on the tiny problem with the given hooks; the trained state."""
    from fedmedbench.fl.api import Method

    class Hooked(Method):
        if extra is not None:
            def extra_loss(self, ctx, model, x, y, logits):
                return extra(model)

        def gradient_correction(self, ctx):
            return correction

    ctx = context(**cfg)
    return Hooked().client_fit(ctx).arrays


def test_the_gradient_correction_hook_is_the_gradient_of_its_linear_loss_term_bit_for_bit():
    """``Method.gradient_correction`` d is added to each step's gradient before clipping: the same bits as the
    loss hook's term <theta, d> (autograd gives d exactly), and not plain SGD's."""
    model = tiny_model()
    d = {n: torch.full_like(p, 0.5) * (i + 1) for i, (n, p) in enumerate(model.named_parameters())}
    plain = hook_fit(grad_clip=0.5)
    corrected = hook_fit(correction=d, grad_clip=0.5)
    linear = hook_fit(extra=lambda m: sum((p * d[n]).sum() for n, p in m.named_parameters()), grad_clip=0.5)
    assert same(corrected, linear) and not same(corrected, plain)
    assert same(plain, fit("fedavg", grad_clip=0.5)[0].arrays)  # no hook: FedAvg's client step, bit for bit
    with pytest.raises(KeyError, match=r"gradient correction: \['nope'\] not trainable parameters"):
        hook_fit(correction={"nope": torch.zeros(1)})


# ---------------------------------------------------------------- FedAdam, FedYogi, FedAdagrad: the server step


class Toy(nn.Module):
    """One trainable vector w (stepped by the server optimizer) and one buffer (averaged)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))
        self.register_buffer("stat", torch.zeros(1))


def fedopt_round(method, state: dict, theta: dict, clients: list[tuple[list[float], float, int]], rnd: int) -> dict:
    """One server round from the clients' (w, stat, examples), averaged by examples."""
    results = [ClientResult({"w": torch.tensor(w, dtype=torch.float32), "stat": torch.tensor([s])}, n) for w, s, n in clients]
    ctx = ServerContext(rnd=rnd, global_arrays=theta, results=results, pids=list(range(len(results))), state=state,
                        num_clients=len(results), device=torch.device("cpu"), train=train_cfg(aggregation="examples"),
                        new_model=Toy)
    return method.aggregate(ctx)


def two_rounds(name: str, delta_2: list[float], params=None) -> tuple[list[float], list[float], dict, float]:
    """Round 1: clients w = (1, -2) with 1 example and (3, 2) with 3 from theta = 0: Delta_1 = (2.5, 1), the
    buffer's average (1 + 3 * 5) / 4 = 4. Round 2: both clients at theta_1 + ``delta_2``."""
    method, state = get_method(name, params), {}
    theta0 = {"w": torch.zeros(2), "stat": torch.zeros(1)}
    theta1 = fedopt_round(method, state, theta0, [([1.0, -2.0], 1.0, 1), ([3.0, 2.0], 5.0, 3)], rnd=1)
    w1 = theta1["w"].double()
    second = (w1 + torch.tensor(delta_2, dtype=torch.float64)).tolist()
    theta2 = fedopt_round(method, state, theta1, [(second, 0.0, 1), (second, 0.0, 1)], rnd=2)
    return w1.tolist(), theta2["w"].double().tolist(), state, float(theta1["stat"])


def test_fedadam_is_adam_on_the_averaged_update_with_flowers_bias_correction():
    """m = 0.9 m + 0.1 Delta, v = 0.99 v + 0.01 Delta^2, theta += eta_t m / (sqrt(v) + 1e-9) with Flower's
    eta_t = 0.1 sqrt(1 - 0.99^(t+1)) / (1 - 0.9^(t+1)); the numbers worked by hand."""
    w1, w2, state, stat = two_rounds("fedadam", [-1.0, 1.0])
    eta_1 = 0.1 * math.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    m1, v1 = [0.25, 0.1], [0.0625, 0.01]  # 0.1 * (2.5, 1); 0.01 * (6.25, 1)
    expect_1 = [eta_1 * m / (math.sqrt(v) + 1e-9) for m, v in zip(m1, v1, strict=True)]
    eta_2 = 0.1 * math.sqrt(1 - 0.99**3) / (1 - 0.9**3)
    m2, v2 = [0.125, 0.19], [0.071875, 0.0199]  # 0.9 m1 + 0.1 (-1, 1); 0.99 v1 + 0.01 (1, 1)
    expect_2 = [w + eta_2 * m / (math.sqrt(v) + 1e-9) for w, m, v in zip(expect_1, m2, v2, strict=True)]
    np.testing.assert_allclose(w1, expect_1, rtol=1e-6)
    np.testing.assert_allclose(w2, expect_2, rtol=1e-6)
    np.testing.assert_allclose(state["m"]["w"], m2, rtol=1e-6)
    np.testing.assert_allclose(state["v"]["w"], v2, rtol=1e-6)
    assert state["m"]["w"].dtype == torch.float64 and stat == 4.0  # the buffer is averaged, not stepped
    w1_paper, _, _, _ = two_rounds("fedadam", [-1.0, 1.0], {"bias_correction": "none"})
    np.testing.assert_allclose(w1_paper, [0.1 * m / (math.sqrt(v) + 1e-9) for m, v in zip(m1, v1, strict=True)], rtol=1e-6)


def test_fedyogi_moves_v_additively_towards_delta_squared():
    """v = v - 0.01 Delta^2 sign(v - Delta^2), theta += 0.01 m / (sqrt(v) + 1e-3), no bias correction. Round 2:
    Delta = (0.125, 0.5): v_1 = 0.0625 > 0.015625 shrinks, v_1 = 0.01 < 0.25 grows (Adam's would give 0.06203125
    and 0.0124)."""
    w1, w2, state, stat = two_rounds("fedyogi", [0.125, 0.5])
    m1, v1 = [0.25, 0.1], [0.0625, 0.01]  # round 1 from v = 0: sign(0 - Delta^2) = -1, so v = 0.01 Delta^2
    expect_1 = [0.01 * m / (math.sqrt(v) + 1e-3) for m, v in zip(m1, v1, strict=True)]
    m2 = [0.9 * 0.25 + 0.1 * 0.125, 0.9 * 0.1 + 0.1 * 0.5]
    v2 = [0.0625 - 0.01 * 0.015625, 0.01 + 0.01 * 0.25]
    expect_2 = [w + 0.01 * m / (math.sqrt(v) + 1e-3) for w, m, v in zip(expect_1, m2, v2, strict=True)]
    np.testing.assert_allclose(w1, expect_1, rtol=1e-6)
    np.testing.assert_allclose(state["v"]["w"], v2, rtol=1e-6)
    np.testing.assert_allclose(w2, expect_2, rtol=1e-6)
    assert stat == 4.0


def test_fedadagrad_sums_the_squared_updates_without_momentum():
    """Flower's FedAdagrad: m = Delta (beta_1 = 0), v = v + Delta^2, theta += 0.1 m / (sqrt(v) + 1e-9)."""
    w1, w2, state, stat = two_rounds("fedadagrad", [-1.0, 1.0])
    expect_1 = [0.1 * 2.5 / (2.5 + 1e-9), 0.1 * 1.0 / (1.0 + 1e-9)]
    expect_2 = [expect_1[0] - 0.1 / (math.sqrt(7.25) + 1e-9), expect_1[1] + 0.1 / (math.sqrt(2.0) + 1e-9)]
    np.testing.assert_allclose(w1, expect_1, rtol=1e-6)
    np.testing.assert_allclose(state["v"]["w"], [7.25, 2.0], rtol=1e-6)  # (6.25, 1) + (1, 1)
    np.testing.assert_allclose(w2, expect_2, rtol=1e-6)
    assert stat == 4.0


# ---------------------------------------------------------------- FedBN: batch norm stays on the site


def test_fedbn_keeps_each_sites_batch_norm_and_sends_the_rest():
    """With BatchNorm (cnn_small: two layers), no BatchNorm parameter or buffer is in the global model or in a
    client's reply; each client trains on with its own batch norm in the next round (its counter adds up the
    steps of both rounds) under the new global rest, and is evaluated with it."""
    from helpers.clients import client_ctx, fresh_global, server_ctx, toy_data, toy_spec, train_config

    from fedmedbench.fl.methods.fedbn import batch_norm_keys

    method, spec = get_method("fedbn"), toy_spec("fedbn", model="cnn_small")
    model = method.build_model(spec)
    bn = set(batch_norm_keys(model))
    assert bn == {f"features.{i}.{k}" for i in (1, 5)
                  for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    g0 = fresh_global(method, spec)
    assert set(g0) == set(model.state_dict()) - bn
    cfg = train_config(optimizer="sgd", lr=0.05)
    states: list[dict] = [{}, {}]
    r1 = [method.client_fit(client_ctx(method, spec, g0, toy_data(seed=p), pid=p, state=states[p], cfg=cfg))
          for p in (0, 1)]
    assert all(set(r.arrays) == set(g0) for r in r1)  # nothing of the batch norm leaves a site
    assert all(set(s["bn"]) == bn for s in states)
    assert not torch.equal(states[0]["bn"]["features.1.running_mean"], states[1]["bn"]["features.1.running_mean"])
    g1 = method.aggregate(server_ctx(method, spec, g0, r1))
    assert set(g1) == set(g0)
    mine = {k: v.clone() for k, v in states[0]["bn"].items()}
    ctx = client_ctx(method, spec, g1, toy_data(seed=0), pid=0, rnd=2, state=states[0], cfg=cfg)
    own = method.personal_model(ctx).state_dict()
    assert all(torch.equal(own[k], mine[k]) for k in bn) and all(torch.equal(own[k], g1[k]) for k in g1)
    r2 = method.client_fit(ctx)
    assert set(r2.arrays) == set(g0)
    assert int(states[0]["bn"]["features.1.num_batches_tracked"]) == 8  # 4 steps in round 1 + 4 in round 2
    assert int(states[1]["bn"]["features.1.num_batches_tracked"]) == 4  # client 1 did not train in round 2


def test_unknown_parameter_and_bad_values_are_named():
    with pytest.raises(TypeError, match=r"fedavg.*unknown parameter"):
        get_method("fedavg", {"mu": 1})
    with pytest.raises(ValueError, match=r"method_params\.fedprox\.mu: must be >= 0, got -1"):
        get_method("fedprox", {"mu": -1})
    with pytest.raises(ValueError, match=r"method_params\.fedlesam\.estimate: 'psychic': choose one of"):
        get_method("fedlesam", {"estimate": "psychic"})
    with pytest.raises(ValueError, match=r"method_params\.feddyn\.lamb: must be > 0"):  # an open bound
        get_method("feddyn", {"lamb": 0.0})
    with pytest.raises(ValueError, match=r"method_params\.moon\.mu: must be of type number"):
        get_method("moon", {"mu": True})


# ---------------------------------------------------------------- through the federation


@pytest.fixture(scope="module")
def fed_setup(tmp_path_factory):
    from helpers import split_labels

    from fedmedbench.data import synthetic
    from fedmedbench.partition import schemes as P
    from fedmedbench.workflow import io

    d = tmp_path_factory.mktemp("methods")
    arrays = synthetic.generate("bloodmnist", 28, seed=0, counts={"train": 240, "val": 40, "test": 80})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "fls", 6, 0, {"alpha": 0.5}, num_classes=8))
    return d


def run_inprocess(d, method, name, rounds=3, params=None, stop=None):
    spec = RunSpec(run_dir=str(d / name), study="t", dataset="bloodmnist", setting="fls", method=method, seed=0,
                   partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28,
                   train={"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "weight_decay": 1e-3,
                          "grad_clip": 10.0, "aggregation": "uniform", "lr_decay": 0.998},
                   clients_per_round=3, method_params=params or {}, device="cpu",
                   early_stopping=stop or {"mode": "none"})
    spec = fed.resolve_data_shapes(spec)
    f = fed.Federation(spec, log=lambda m: None)
    return f, f.run(fed.InProcessTransport(spec))


ALL = ["fedavg", "fedprox", "scaffold", "feddyn", "fedsam", "fedspeed", "fedsmoo", "fedgamma", "fedlesam", "fedwmsam",
       "fedadam", "fedyogi", "fedadagrad", "fedbn"]


@pytest.mark.parametrize("method", ALL)
def test_every_method_runs_a_federation_and_resumes_identically(fed_setup, method):
    f, full = run_inprocess(fed_setup, method, f"{method}-full", rounds=3)
    assert full.round == 3 and all(np.isfinite(r["train_loss"]) for r in full.rows)
    assert {"task_norm", "growth_rate", "saturation"} <= set(full.rows[-1])
    # A run stopped after round 2 (its checkpoint and client states on disk) and resumed to round 3:
    # run 2 rounds, then re-label that checkpoint with the 3-round run's hash and continue.
    _, part = run_inprocess(fed_setup, method, f"{method}-part", rounds=2)
    target = fed_setup / f"{method}-resumed"
    shutil.copytree(fed_setup / f"{method}-part", target)
    spec3 = RunSpec(**{**f.spec.to_dict(), "run_dir": str(target)})
    checkpoint.save(target, part, spec3.run_hash())
    resumed = fed.Federation(spec3, log=lambda m: None).run(fed.InProcessTransport(spec3))
    assert resumed.round == 3
    for k in full.arrays:
        assert np.array_equal(full.arrays[k], resumed.arrays[k]), (method, k)
    assert json.dumps(full.rows[-1].get("growth_rate")) == json.dumps(resumed.rows[-1].get("growth_rate"))


def test_datafree_mode_stops_the_run(fed_setup):
    _, state = run_inprocess(fed_setup, "fedavg", "stop", rounds=8, stop={"mode": "datafree", "tau": 10.0, "patience": 2})
    assert state.round == 4  # reference counting: g_2 not counted, kappa_3 = 1, kappa_4 = 2: r* = 4
    assert state.rows[-1]["datafree_stop"] == 1
    _, paper = run_inprocess(fed_setup, "fedavg", "stop-paper", rounds=8,
                             stop={"mode": "datafree", "tau": 10.0, "patience": 2, "counting": "paper"})
    assert paper.round == 3  # Eqs. 4-5: kappa_2 = 1, kappa_3 = 2


@pytest.mark.parametrize("name", ["timm:convnextv2_atto", "timm:convnextv2_nano"])
def test_convnextv2_builds_offline_at_64px(name):
    from fedmedbench.models import build_model

    model = build_model(name, in_channels=3, num_classes=7, image_size=64)
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 7)
    assert not any("num_batches_tracked" in k for k in model.state_dict())  # LayerNorm/GRN, no BN buffers


def test_bf16_autocast_and_channels_last_train_and_differ_from_fp32():
    """train.autocast=bf16 really computes forwards in bfloat16 (different weights than fp32, still finite);
    channels_last keeps the same maths (close to fp32) with NHWC conv weights."""
    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.training import local_sgd
    from fedmedbench.models import build_model

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 4, (64,), generator=g)

    def train(**opts):
        torch.manual_seed(0)
        model = build_model("cnn_small", 3, 4, 28)
        cfg = TrainConfig(rounds=1, local_epochs=1, batch_size=16, lr=0.05, **opts)
        loss = local_sgd(model, x, y, 4, cfg, 1, torch.device("cpu"), torch.Generator().manual_seed(1))
        return model, loss

    ref, _ = train()
    bf16, loss = train(autocast="bf16")
    nhwc, _ = train(channels_last=True)
    assert np.isfinite(loss)
    diffs = [float((a - b).abs().max()) for a, b in zip(ref.parameters(), bf16.parameters(), strict=True)]
    assert max(diffs) > 1e-4  # bf16 forwards change the result
    for a, b in zip(ref.parameters(), nhwc.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    conv = next(m for m in nhwc.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="train.autocast"):
        train(autocast="fp8")


def test_compile_trains_the_same_maths_and_traces_once():
    """train.compile runs the compiled forward, traced once and reused across client calls on the
    resident model and by a fresh model of the same architecture; it reaches the eager weights to
    float tolerance and leaves the state_dict keys unchanged (checkpoints and aggregation see the
    same names)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.training import local_sgd

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (32, 1, 4, 4), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

    def train(m: torch.nn.Module, rnd: int, **opts) -> None:
        cfg = TrainConfig(rounds=2, local_epochs=1, batch_size=8, lr=0.1, **opts)
        local_sgd(m, x, y, 4, cfg, rnd, torch.device("cpu"), torch.Generator().manual_seed(rnd))

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = model(), model()
    keys = list(compiled.state_dict())
    for rnd in (1, 2):  # two client calls on the same (resident) model
        train(eager, rnd)
        train(compiled, rnd, compile=True)
    assert counters["stats"]["unique_graphs"] == 1 and counters["stats"]["calls_captured"] > 0
    train(model(), 1, compile=True)  # a fresh model object of the same architecture: no new trace
    assert counters["stats"]["unique_graphs"] == 1
    assert list(compiled.state_dict()) == keys
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    counters.clear()
    train(model(), 1)  # off by default: nothing compiled
    assert not counters["stats"]


def test_double_input_normalisation_as_the_reference_dataset():
    """dataset.py: Normalize(0.5, 0.5) on ToTensor's [0, 1], stored, then again per item: x = 4 p / 255 - 3."""
    from fedmedbench.fl.methods._sgd import with_input_norm

    x_u8 = torch.tensor([[[[0, 255], [51, 128]]]], dtype=torch.uint8)
    x = to_float(x_u8, torch.device("cpu"))
    seen = with_input_norm(nn.Identity(), "double")(x)
    torch.testing.assert_close(seen, x_u8.float() * 4 / 255 - 3)
    assert torch.equal(with_input_norm(nn.Identity(), "single")(x), x)
    model = with_input_norm(tiny_model(), "double")
    assert list(model.state_dict()) == list(tiny_model().state_dict())  # a hook: same weights, same keys
    assert torch.equal(copy.deepcopy(model)(x), tiny_model()(x * 2 - 1))  # survives the engine's model copies
    with pytest.raises(ValueError, match="input_norm"):
        with_input_norm(tiny_model(), "triple")


def test_nonfinite_loss_stops_by_default_and_continues_as_the_reference_on_request():
    from fedmedbench.fl.training import NonFiniteLossError
    from fedmedbench.metrics.classification import classification_metrics

    def broken():
        m = tiny_model()
        with torch.no_grad():
            m[1].weight[0, 0] = float("nan")
        return m

    with pytest.raises(NonFiniteLossError, match="on_nonfinite"):
        fit("fedavg", model=broken())
    result, _ = fit("fedavg", model=broken(), on_nonfinite="continue")
    assert all(np.isnan(v).all() for k, v in result.arrays.items() if k.startswith("3."))  # NaN spreads, no abort
    # a NaN model predicts class 0 (argmax of NaN, as torch.argmax in the reference): chance-level balanced accuracy
    probs = np.full((6, N_CLASSES), np.nan)
    out = classification_metrics(np.array([0, 1, 2, 0, 1, 2]), probs, float("nan"))
    assert out["balanced_accuracy"] == pytest.approx(1 / N_CLASSES)


def _deep_model(layers: int) -> nn.Module:
    torch.manual_seed(0)
    body = [m for _ in range(layers) for m in (nn.Linear(4, 4), nn.Tanh())]
    return nn.Sequential(nn.Flatten(), *body, nn.Linear(4, N_CLASSES))


def _client_ops(method: str, params: dict, layers: int) -> int:
    """Non-view ATen ops (kernel launches on a GPU) of one two-step client_fit on a model of 2 * (layers + 1) tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += not func.is_view
            return func(*args, **(kwargs or {}))

    model = _deep_model(layers)
    broadcast = {"last_update": {n: torch.full(p.shape, 0.01) for n, p in model.named_parameters()}}
    ctx = context(model=model, steps=2, broadcast=broadcast if method == "fedlesam" else None)
    with Count():
        get_method(method, params).client_fit(ctx)
    return Count.n


@pytest.mark.parametrize("method,params", [(m, {}) for m in ALL] + [
    ("fedlesam", {"perturbation_form": "vector"}), ("fedwmsam", {"perturbation_form": "vector"})])
def test_client_ops_grow_linearly_with_the_parameter_tensors(method, params):
    """A client's step launches a bounded number of ops per parameter tensor: doubling the tensors must not
    quadruple the ops (a norm over all tensors recomputed for each tensor made FedSMOO's step O(P^2):
    80,000 launches per step for ConvNeXtV2-nano's 160 tensors)."""
    small, large = _client_ops(method, params, 8), _client_ops(method, params, 16)  # 18 and 34 tensors
    assert large / small < 2.3, f"{method} {params}: {small} ops with 18 tensors, {large} with 34"


def test_multi_tensor_arithmetic_is_one_op_and_the_per_tensor_result_bit_for_bit():
    """_sgd's add/sub/mul/div/neg/add_ launch one op for all tensors (one kernel on a GPU, not one per
    tensor) and give exactly the per-tensor results, signed zeros, infinities and NaNs included."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fedmedbench.fl.methods import _sgd

    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -3.5])
    a = {f"t{i}": torch.cat([torch.randn(i + 1, generator=g), special]) for i in range(6)}
    b = {n: torch.randn(t.shape, generator=g).flip(0) for n, t in a.items()}
    b["t0"][:7] = special.flip(0)

    class Ops(TorchDispatchMode):
        names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    cases = [(_sgd.add, lambda x, y: x + y, b), (_sgd.sub, lambda x, y: x - y, b), (_sgd.mul, lambda x, y: x * y, b),
             (_sgd.div, lambda x, y: x / y, b), (_sgd.add, lambda x, y: x + y, 0), (_sgd.div, lambda x, y: x / y, 0.37),
             (_sgd.mul, lambda x, y: x * y, torch.tensor(-0.25))]
    for fn, per_tensor, other in cases:
        Ops.names = []
        with Ops():
            got = fn(a, other)
        assert len(Ops.names) == 1 and Ops.names[0].startswith("aten._foreach_"), (fn.__name__, Ops.names)
        for n, t in a.items():
            want = per_tensor(t, other[n] if isinstance(other, dict) else other)
            assert torch.equal(got[n].view(torch.int32), want.view(torch.int32)), (fn.__name__, n)
    negated = _sgd.neg(a)
    assert all(torch.equal(negated[n].view(torch.int32), (-t).view(torch.int32)) for n, t in a.items())
    copy_a = {n: t.clone() for n, t in a.items()}
    _sgd.add_(copy_a, b)
    assert all(torch.equal(copy_a[n].view(torch.int32), (a[n] + b[n]).view(torch.int32)) for n in a)
    assert _sgd.add({}, b) == {} and _sgd.sam_perturbation({}, 0.1) == {}


def test_broadcast_vectors_are_copied_by_one_op_bit_for_bit():
    """A broadcast set of float32 device tensors (SCAFFOLD's c, FedSMOO's s, FedWMSAM's momentum) becomes
    the client's own copy by one concatenation, not one copy per tensor; NumPy arrays keep their path."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fedmedbench.fl.methods import _sgd

    special = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-45])
    a = {f"t{i}": torch.cat([torch.randn(i + 1, 2).reshape(-1), special]).reshape(-1, 1) for i in range(5)}

    class Ops(TorchDispatchMode):
        names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                Ops.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Ops():
        got = _sgd.arrays_to_vector(a)
    assert Ops.names == ["aten.cat"]
    for n, t in a.items():
        assert got[n].shape == t.shape and got[n].dtype == torch.float32
        assert torch.equal(got[n].view(torch.int32), t.view(torch.int32))
        assert got[n].untyped_storage().data_ptr() != t.untyped_storage().data_ptr()  # a copy, not the broadcast
    before = {n: t.clone() for n, t in a.items()}
    got["t0"].add_(1.0)  # the client changes its copy: neither the broadcast nor its other vectors move
    assert all(torch.equal(a[n].view(torch.int32), before[n].view(torch.int32)) for n in a)
    assert torch.equal(got["t1"].view(torch.int32), a["t1"].view(torch.int32))
    host = _sgd.arrays_to_vector({"w": np.array([1.5, -0.0], dtype=np.float64), "b": np.array([2], dtype=np.int64)})
    assert host["w"].dtype == torch.float32 and host["w"].tolist() == [1.5, -0.0] and host["b"].dtype == torch.float32


# ---------------------------------------------------------------- every method's honest replies pass the server's checks

#: the classification methods; the segmentation methods: tests/test_fedst_fl.py, UltraFlwr: tests/test_ultraflwr.py
CLASSIFICATION_METHODS = [*ALL, "local", "centralized", "moon", "feddg", "gpaf"]


def checked_replies(monkeypatch) -> list[tuple[int, int, list[str], list[str]]]:
    """(round, client, model keys, extra records) of every reply the server checked (and accepted)."""
    from fedmedbench.fl.engine import replies

    seen = []
    original = replies.ReplyCheck.check

    def spy(self, pid, arrays, num_examples, extras=None):
        original(self, pid, arrays, num_examples, extras)
        seen.append((self.rnd, pid, sorted(arrays), sorted(extras or {})))

    monkeypatch.setattr(replies.ReplyCheck, "check", spy)
    return seen


def run_and_check_replies(spec, seen) -> list[tuple[int, int, list[str], list[str]]]:
    """Run ``spec`` 2 rounds in process: every sampled client's reply was checked once, and its model keys are
    the method's declared ones (its extra records among the declared)."""
    f = fed.Federation(spec, log=lambda m: None)
    f.run(fed.InProcessTransport(spec))
    assert [(r, p) for r, p, _, _ in seen] == [(r, p) for r in (1, 2) for p in f.sample(r)]
    model = f.job.new_model()
    for rnd, _, keys, extras in seen:
        declared = f.method.reply_keys(model, rnd, f.train)
        assert keys == sorted(declared["arrays"]) and set(extras) <= set(declared) - {"arrays"}
    return seen


@pytest.mark.parametrize("method", CLASSIFICATION_METHODS)
def test_every_methods_honest_replies_pass_the_servers_checks(fed_setup, method, monkeypatch):
    """Two rounds per method: each sampled client's reply is checked against what the method declares
    (``Method.reply_keys``) and accepted; the model arrays sent are exactly the declared keys."""
    seen = checked_replies(monkeypatch)
    spec = RunSpec(run_dir=str(fed_setup / f"replies-{method}"), study="t", dataset="bloodmnist", setting="fls",
                   method=method, seed=0, partition_path=str(fed_setup / "p.json"),
                   sources={"base": str(fed_setup / "b.npz")}, image_size=28, clients_per_round=3, device="cpu",
                   model="gpaf_cnn" if method == "gpaf" else "cnn_small",
                   train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "grad_clip": 10.0})
    run_and_check_replies(fed.resolve_data_shapes(spec), seen)


def test_every_built_in_method_has_an_honest_reply_test():
    from fedmedbench.fl.api.registry import available_methods
    from fedmedbench.studies.fedst.runs import METHODS as SEGMENTATION_METHODS

    assert set(available_methods()) == {*CLASSIFICATION_METHODS, *SEGMENTATION_METHODS, "ultraflwr"}


def test_client_sgd_is_the_multi_tensor_step_with_the_per_tensor_loops_bits():
    """make_optimizer's SGD runs torch's multi-tensor step on every device (few ops a step); on the CPU its
    weights equal the per-tensor loop's bit for bit (momentum, weight decay, 20 steps)."""
    from fedmedbench.fl.training import make_optimizer

    cfg = train_cfg(lr=0.01, momentum=0.9, weight_decay=1e-3)

    def run(foreach: bool) -> list[torch.Tensor]:
        model = tiny_model(seed=3)
        opt = make_optimizer(model, cfg, rnd=1)
        assert opt.defaults["foreach"] is True
        if not foreach:
            opt.param_groups[0]["foreach"] = False
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(True), run(False), strict=True))
