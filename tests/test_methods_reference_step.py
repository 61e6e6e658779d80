"""The ten early-stopping optimizers' client rounds against the reference client code, step by step.

Every case runs ``client_fit`` for 6 steps (2 epochs of 3 batches) with SGD momentum 0.9, weight
decay 1e-3, gradient clipping that is active at every step (max norm 0.02), non-zero lambda/rho/alpha
and non-zero incoming client and server vectors, and compares the weights (and the client's new
state) with a plain-torch re-statement of the reference client (yjlee22/earlystop, client/*.py,
optimizer/*.py, server/*.py). The re-statement works as the reference does: flat parameter vectors
(utils.py:10-15 ``param_to_vector``), corrections as loss terms <theta, d> differentiated by autograd,
one ``torch.optim.SGD(momentum=0.9)`` built per client round (client/client.py:27,38-40 and
server/server.py:343-352: a new client object each round), and the step order gradient(s),
corrections, clip, step.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_methods import context, tiny_data, tiny_model
from torch import nn

from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.api.registry import get_method

ALL = ["fedavg", "fedprox", "feddyn", "scaffold", "fedsam", "fedspeed", "fedsmoo", "fedgamma", "fedlesam", "fedwmsam"]

LR, WD, CLIP, MOMENTUM = 0.1, 1e-3, 0.02, 0.9
EPOCHS, BATCH, N = 2, 8, 24
STEPS = EPOCHS * N // BATCH  # 6
LAMB, RHO, ALPHA = 0.05, 0.05, 0.3
TOL = dict(rtol=0.0, atol=1e-6)

PARAMS = {
    "fedavg": {},
    "fedprox": {"mu": LAMB},
    "feddyn": {"lamb": LAMB},
    "scaffold": {},
    "fedsam": {"rho": RHO},
    "fedspeed": {"rho": RHO, "lamb": LAMB},
    "fedsmoo": {"rho": RHO, "lamb": LAMB},
    "fedgamma": {"rho": RHO},
    "fedlesam": {"rho": RHO},
    "fedwmsam": {"rho": RHO, "alpha": ALPHA},
}
#: the reference's base optimizer weight decay is weight_decay + lamb for these (client/fedprox.py:9,
#: feddyn.py:9, fedspeed.py:10, fedsmoo.py:10); weight_decay alone for the others (client.py:27)
DECAY_PLUS_LAMB = {"fedprox", "feddyn", "fedspeed", "fedsmoo"}
#: which incoming vectors each method reads: client state (ours: ctx.state) and server broadcast
STATE_KEYS = {"feddyn": ["h_i"], "fedspeed": ["h_i"], "fedsmoo": ["h_i", "mu_i"],
              "scaffold": ["c_i"], "fedgamma": ["c_i"], "fedwmsam": ["c_i"]}
BROADCAST_KEYS = {"scaffold": ["c"], "fedgamma": ["c"], "fedwmsam": ["c", "momentum"], "fedsmoo": ["s"],
                  "fedlesam": ["last_update"]}


# ------------------------------------------------------------------ flat vectors as the reference keeps them


def flat(model: nn.Module) -> torch.Tensor:
    """The parameters as one vector sharing their storage (utils.py:10-15), so a loss on it reaches them."""
    return torch.cat([p.reshape(-1) for p in model.parameters()])


def named(vec: torch.Tensor, model: nn.Module) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for n, p in model.named_parameters():
        out[n] = vec[at : at + p.numel()].reshape(p.shape).clone()
        at += p.numel()
    return out


def flatten(t: dict, model: nn.Module) -> torch.Tensor:
    return torch.cat([torch.as_tensor(t[n]).reshape(-1) for n, _ in model.named_parameters()]).float()


def batches() -> list[torch.Tensor]:
    """The mini-batches ``context`` draws: a fresh shuffle per epoch from a generator seeded 7."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(EPOCHS):
        perm = torch.randperm(N, generator=g)
        out += [perm[s : s + BATCH] for s in range(0, N, BATCH)]
    return out


def incoming(model: nn.Module, seed: int = 3) -> tuple[dict, dict]:
    """Non-zero client state and server broadcast (float32 tensors, as ctx.state keeps and the server sends them)."""
    g = torch.Generator().manual_seed(seed)

    def vec(scale):
        return {n: torch.randn(p.shape, generator=g) * scale for n, p in model.named_parameters()}

    state = {"h_i": vec(0.05), "c_i": vec(0.05), "mu_i": vec(0.01)}
    broadcast = {k: vec(s)
                 for k, s in (("c", 0.05), ("momentum", 0.02), ("s", 0.01), ("last_update", 0.02))}
    broadcast["alpha"] = {"alpha": torch.tensor(ALPHA, dtype=torch.float64)}
    return state, broadcast


# ------------------------------------------------------------------ the reference client, re-stated


def ce_grad_at(model, xb, yb, shift=None, loss=None):
    """Gradient at theta + shift (shift: one tensor or scalar per parameter), weights moved back after,
    as ESAM/DRegSAM/LESAM/WMSAM second_step do (optimizer/ESAM.py:38-46)."""
    params = list(model.parameters())
    with torch.no_grad():
        for p, e in zip(params, shift or [0.0] * len(params), strict=True):
            p.add_(e)
    for p in params:
        p.grad = None  # Optimizer.zero_grad (ESAM.py:56,65)
    (loss or (lambda: nn.functional.cross_entropy(model(xb), yb)))().backward()
    with torch.no_grad():
        for p, e in zip(params, shift or [0.0] * len(params), strict=True):
            p.sub_(e)


def sam_shift(model, xb, yb, rho, minus=None):
    """ESAM.first_step (optimizer/ESAM.py:19-35,71-79): e = rho g / (||g|| + 1e-7), ||g|| the norm of the
    per-tensor norms; DRegSAM.first_step (optimizer/DRegSAM.py:20-43) first subtracts mu + s from g."""
    ce_grad_at(model, xb, yb)
    grads = [p.grad.clone() for p in model.parameters()]
    if minus is not None:
        grads = [g - m for g, m in zip(grads, minus, strict=True)]
    norm = torch.norm(torch.stack([g.norm(p=2) for g in grads]), p=2)
    return [g * (rho / (norm + 1e-7)) for g in grads]


def indexed_shift(v: torch.Tensor, rho: float, count: int) -> list[torch.Tensor]:
    """LESAM/WMSAM.first_step (optimizer/LESAM.py:20-47, WMSAM.py:22-49): the flat vector v indexed by
    the parameter's position, tensor j shifted as a whole by -v[j] rho / (sum_k |v[k]| + 1e-7), k < count."""
    norm = sum(v[j].norm(p=2) for j in range(count))
    return [-v[j] * (rho / (norm + 1e-7)) for j in range(count)]


def reference_round(method: str, model: nn.Module, state: dict, broadcast: dict) -> tuple[dict, list[float]]:
    """One client round of the reference on ``model`` (in place); returns the client's new vectors and
    the gradient norm before clipping at each step."""
    data = tiny_data()
    x = data.train_x.float().div(127.5).sub(1.0)
    y = data.train_y
    count = len(list(model.parameters()))
    theta_g = flat(model).detach().clone()  # Params_list (client.py:20-24)
    v = {k: flatten(t, model) for k, t in {**state, **broadcast}.items() if k != "alpha"}
    # FedDyn/FedSpeed/FedSMOO: Local_dual_correction = h_i - theta_g (server/FedDyn.py:36, FedSpeed.py:31,
    # FedSMOO.py:48); SCAFFOLD/FedGamma: Local_VR_correction = c - c_i (server/SCAFFOLD.py:37, FedGamma.py:36)
    dual = v["h_i"] - theta_g
    vr = v["c"] - v["c_i"]
    # FedWMSAM: Client_momentum = m + (c - c_i) alpha / (1 - alpha) (server/FedWMSAM.py:34-39)
    m_i = v["momentum"] + vr * ALPHA / (1 - ALPHA)
    target = theta_g.clone()  # client/fedwmsam.py:17
    mu = list(named(v["mu_i"], model).values())  # Dynamic_dual (server/FedSMOO.py:49)
    s = list(named(v["s"], model).values())  # Dynamic_dual_correction (server/FedSMOO.py:50)
    decay = WD + (LAMB if method in DECAY_PLUS_LAMB else 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=decay)  # client.py:38-40
    params = list(model.parameters())
    norms = []

    def ce():
        return nn.functional.cross_entropy(model(xb), yb)

    for idx in batches():
        xb, yb = x[idx], y[idx]
        if method == "fedavg":  # client/client.py:67-71
            ce_grad_at(model, xb, yb)
        elif method == "fedprox":  # client/fedprox.py:41-51: CE - lamb <theta, theta_g>
            ce_grad_at(model, xb, yb, loss=lambda: ce() + LAMB * (-1.0 * torch.sum(flat(model) * theta_g)))
        elif method == "feddyn":  # client/feddyn.py:41-51: CE + lamb <theta, h_i - theta_g>
            ce_grad_at(model, xb, yb, loss=lambda: ce() + LAMB * torch.sum(flat(model) * dual))
        elif method == "scaffold":  # client/scaffold.py:18-28: CE + <theta, c - c_i>
            ce_grad_at(model, xb, yb, loss=lambda: ce() + torch.sum(flat(model) * vr))
        elif method in ("fedsam", "fedspeed", "fedgamma"):  # ESAM.step (optimizer/ESAM.py:49-68)
            ce_grad_at(model, xb, yb, shift=sam_shift(model, xb, yb, RHO))
            if method == "fedspeed":  # client/fedspeed.py:45-49: + lamb <theta, h_i - theta_g>, accumulated
                (LAMB * torch.sum(flat(model) * dual)).backward()
            elif method == "fedgamma":  # client/fedgamma.py:44-48: + <theta, c - c_i>, accumulated
                torch.sum(flat(model) * vr).backward()
        elif method == "fedsmoo":  # DRegSAM.step (optimizer/DRegSAM.py:67-88), client/fedsmoo.py:50-57
            e = sam_shift(model, xb, yb, RHO, minus=[a + b for a, b in zip(mu, s, strict=True)])
            mu = [a + ei - b for a, ei, b in zip(mu, e, s, strict=True)]  # DRegSAM.py:45-51
            ce_grad_at(model, xb, yb, shift=e)
            (LAMB * torch.sum(flat(model) * dual)).backward()
        elif method == "fedlesam":  # client/fedlesam.py:45-47; global_update = u (server/FedLESAM.py:26)
            ce_grad_at(model, xb, yb, shift=indexed_shift(v["last_update"], RHO, count))
        elif method == "fedwmsam":  # client/fedwmsam.py:53-55, WMSAM.step (optimizer/WMSAM.py:61-70)
            differ = target - flat(model).detach()
            ce_grad_at(model, xb, yb, shift=indexed_shift(differ, RHO, count),  # loss_gamma (fedwmsam.py:6-11)
                       loss=lambda: ALPHA * ce() + torch.sum(flat(model) * m_i) * (1 - ALPHA))
        norms.append(float(nn.utils.clip_grad_norm_(params, max_norm=CLIP)))  # e.g. client/client.py:73
        opt.step()
        if method == "fedwmsam":
            target = target + m_i  # client/fedwmsam.py:63
    update = flat(model).detach() - theta_g  # local_update_list (client.py:76-77)
    new = {}
    if method in ("feddyn", "fedspeed", "fedsmoo"):  # h_i += update (server/FedDyn.py:45-46, FedSMOO.py:67)
        new["h_i"] = named(v["h_i"] + update, model)
    if method in ("scaffold", "fedgamma", "fedwmsam"):
        # c_i+ = c_i - c - update / K / lr, K = E n_0 / B (server/SCAFFOLD.py:22,50-54, FedWMSAM.py:19,58-61)
        k = EPOCHS * N / BATCH
        new["c_i"] = named(v["c_i"] - v["c"] - update / k / LR, model)
    if method == "fedsmoo":  # local_dynamic_dual (client/fedsmoo.py:66, server/FedSMOO.py:68-71)
        new["mu_i"] = {n: t.detach().clone() for (n, _), t in zip(model.named_parameters(), mu, strict=True)}
    return new, norms


# ------------------------------------------------------------------ the comparisons


def ours_and_reference(method: str, rounds: int):
    """``rounds`` consecutive rounds of one client, ours and the reference's, on the same model object
    each (the engine's resident model is reused across rounds: job.py ``model_with``); the client state
    carries over, the broadcast stays; each round starts from the previous round's weights."""
    model = tiny_model()
    state, broadcast = incoming(model)
    ref_model = copy.deepcopy(model)
    ours_state = {k: {n: t.clone() for n, t in state[k].items()} for k in STATE_KEYS.get(method, [])}
    ref_state = {k: {n: t.clone() for n, t in v.items()} for k, v in state.items()}
    bc = {k: broadcast[k] for k in [*BROADCAST_KEYS.get(method, []), *(["alpha"] if method == "fedwmsam" else [])]}
    m = get_method(method, PARAMS[method])
    norms = []
    for rnd in range(1, rounds + 1):
        ctx = context(model=model, state=ours_state, broadcast=bc, steps=STEPS, rnd=rnd, lr=LR,
                      momentum=MOMENTUM, weight_decay=WD, grad_clip=CLIP, batch_size=BATCH, local_epochs=EPOCHS,
                      sizes=(N, N))
        result = m.client_fit(ctx)
        new, round_norms = reference_round(method, ref_model, ref_state, broadcast)
        ref_state.update(new)
        norms += round_norms
    return result, ctx, ref_model, ref_state, norms


def assert_matches(method, result, ctx, ref_model, ref_state):
    for n, p in ref_model.named_parameters():
        torch.testing.assert_close(result.arrays[n], p.detach(), **TOL, msg=lambda s, n=n: f"{n}: {s}")
    for key in STATE_KEYS.get(method, []):
        for n, t in ref_state[key].items():
            torch.testing.assert_close(ctx.state[key][n], t, **TOL, msg=lambda s, k=key, n=n: f"{k}[{n}]: {s}")


@pytest.mark.parametrize("method", ALL)
def test_one_round_matches_the_reference_client(method):
    result, ctx, ref_model, ref_state, norms = ours_and_reference(method, rounds=1)
    assert len(norms) == STEPS and min(norms) > 2 * CLIP  # clipping acts at every step
    assert_matches(method, result, ctx, ref_model, ref_state)
    start = model_arrays(tiny_model())
    assert any(not torch.allclose(result.arrays[k], start[k], atol=1e-4) for k in start)  # the round moved the weights


@pytest.mark.parametrize("method", ALL)
def test_second_round_starts_a_fresh_momentum_buffer(method):
    """Round 2 on the same client and model object: the reference builds a new client, hence a new SGD
    (zero momentum buffer), every round (server/server.py:343-352)."""
    result, ctx, ref_model, ref_state, _ = ours_and_reference(method, rounds=2)
    assert_matches(method, result, ctx, ref_model, ref_state)
