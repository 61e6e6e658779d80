"""FedWMSAM (Li et al., NeurIPS 2025): weighted momentum + momentum-guided SAM.

Following the authors' public code (FL-Simulator based, the code of the early-stopping
study's group):
Server state: momentum m (a gradient estimate: m = -mean(Delta_i / (K_i lr)) * lr_decay),
SCAFFOLD's control variate c, and an adaptive weight alpha.
Client i (state: c_i): client momentum  m_i = m + (c - c_i) * alpha / (1 - alpha);
each step minimises  alpha * CE(theta) + (1 - alpha) * <theta, m_i>  (weighted
momentum, C2) at a perturbed point theta + e, with e = sign * rho * (t - theta)/||t - theta||
where the target t starts at theta_g and moves by m_i after every step (momentum-
guided perturbation, C1; one backward pass per step). sign = -1 in the public code;
the README's formula has +1 (``perturbation_sign``). ``perturbation_form``: "reference"
(default; optimizer/WMSAM.py indexes the flat t - theta by parameter position, so tensor j
moves as a whole by sign * rho * (t - theta)[j] / sum_k |(t - theta)[k]|, k over the P
parameter tensors, see ``indexed_perturbation``) or "vector" (the formula above, the
paper's). c_i is updated as SCAFFOLD option II and delta_c_i sent.
Server: alpha <- 0.99 alpha + 0.01 clip(mean_i v_i, 0.1, 0.9) with v_i = 1 + cos(Delta_i, m)
(adaptive schedule, C3, using the momentum before this round's update), and v_i = 0 when
Delta_i or m is zero, as the reference's cosine_similarity returns: in the first round
(m = 0) alpha becomes 0.99 alpha + 0.01 * 0.1. The clip is the reference's max(0.1, min(mean, 0.9)):
a NaN mean (a client's update NaN) counts as 0.1. c += sum delta_c_i / N; m from this
round's updates; theta_g += eta_g mean(Delta_i). K in the c_i and m updates: see
SCAFFOLD (``local_iterations``).
"""

from __future__ import annotations

import numpy as np
import torch

from fedmedbench.fl.api.arrays import snapshot
from fedmedbench.fl.api.method import ClientContext, ClientResult, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._perturb import BatchedPerturbation, Perturbation
from fedmedbench.fl.methods._sgd import (
    LOCAL_ITERATIONS,
    PERTURBATION_FORMS,
    ServerOptMethod,
    StepHooks,
    Tensors,
    add,
    add_,
    arrays_to_vector,
    cast_like,
    div,
    indexed_perturbation,
    leading_entries,
    local_iterations,
    mul,
    neg,
    sam_perturbation,
    sent_vectors,
    sub,
    to_tensors,
    trainable,
    trained_params,
    vectors64,
)
from fedmedbench.fl.methods.scaffold import control_correction, server_control_update, updated_control


class MomentumGuided(Perturbation):
    """FedWMSAM's perturbation (C1): e = rho * (t - theta)/||t - theta|| with rho signed (``vector``), or
    ``indexed_perturbation`` of t - theta (``reference``); the target t starts at theta_g and moves by m_i
    after every step (:meth:`advance`). ``params``: the client model's own parameters (theta, live)."""

    shared = ("rho", "form")  # the batched form's one rho and form
    every_client = True  # a client without one would get the ascent towards t = 0

    def __init__(self, rho: float, form: str, target: Tensors, m_i: Tensors, params: Tensors) -> None:
        self.rho, self.form, self.target, self.m_i, self.params = rho, form, target, m_i, params
        self.order = list(params)

    def __call__(self, model, xb, yb) -> Tensors:
        if self.form == "reference":
            return indexed_perturbation((self.target[n] - self.params[n].detach() for n in self.order), self.order, self.rho)
        return sam_perturbation({n: self.target[n] - p.detach() for n, p in self.params.items()}, self.rho)

    def advance(self) -> None:
        add_(self.target, self.m_i)

    @classmethod
    def batched(cls, perturbs, stack) -> BatchedPerturbation:
        return _BatchedMomentumGuided(perturbs, stack)


class _BatchedMomentumGuided(BatchedPerturbation):
    def __init__(self, perturbs: list[MomentumGuided], stack) -> None:
        self.stack, self.rho, self.form = stack, perturbs[0].rho, perturbs[0].form
        self.target = stack.stacked([p.target for p in perturbs])
        self.m_i = stack.stacked([p.m_i for p in perturbs])

    def e(self, weights, grads, n):
        d = torch._foreach_sub(self.stack.first(self.target, n), weights)
        if self.form != "reference":
            return self.stack.sam(d, self.rho)
        # indexed_perturbation per client: its first P entries of t - theta, one scalar per parameter tensor
        v = leading_entries(d, len(d), n)
        ev = v * (self.rho / (v.abs().sum(dim=1) + 1e-7)).unsqueeze(1)
        return [column.view(n, *([1] * (w.dim() - 1))).expand_as(w) for column, w in zip(ev.unbind(1), weights, strict=True)]

    def after_step(self, n) -> None:
        torch._foreach_add_(self.stack.first(self.target, n), self.stack.first(self.m_i, n))


@register_method("fedwmsam")
class FedWMSAM(ServerOptMethod):
    extra_records = ("delta_c",)

    params = (Param("rho", float, 0.1, "SAM ascent radius", low=0),
              Param("alpha", float, 0.1, "initial momentum weight", low=0, high=1, low_open=True, high_open=True),
              Param("perturbation_sign", int, -1, "sign of the momentum-guided perturbation", choices=(-1, 1)),
              Param("local_iterations", str, "reference", "K of the control-variate update: reference (E n_0 / B) or per_client", choices=LOCAL_ITERATIONS),
              Param("perturbation_form", str, "reference", "per-tensor (reference) or whole-vector norm", choices=PERTURBATION_FORMS))

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.rho, self.alpha0, self.sign = float(self.p["rho"]), float(self.p["alpha"]), int(self.p["perturbation_sign"])
        self.k_form, self.form = self.p["local_iterations"], self.p["perturbation_form"]

    def hooks(self, ctx: ClientContext) -> StepHooks:
        like = trainable(ctx.model)
        alpha = float(ctx.broadcast["alpha"]["alpha"]) if "alpha" in ctx.broadcast else self.alpha0
        c, c_i, corr = control_correction(ctx)
        m = arrays_to_vector(ctx.broadcast["momentum"]) if "momentum" in ctx.broadcast else {
            n: torch.zeros_like(t) for n, t in corr.items()}
        m_i = {n: t.to(ctx.device) for n, t in add({n: m[n] for n in like}, div(mul(corr, alpha), 1 - alpha)).items()}
        target = snapshot(to_tensors(ctx.global_arrays, like), ctx.device)  # advanced in place: a copy
        guided = MomentumGuided(self.sign * self.rho, self.form, target, m_i, like)
        return StepHooks(perturb=guided, correction=mul(m_i, 1 - alpha), loss_weight=alpha, after_step=guided.advance,
                         keep={"c": c, "c_i": c_i})

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics, arrays) -> ClientResult:
        k = local_iterations(ctx, self.k_form)
        ctx.state["c_i"], dc = updated_control(ctx, hooks.keep["c"], hooks.keep["c_i"], k, trained_params(ctx, arrays))
        return ClientResult(arrays=arrays, num_examples=ctx.data.num_train,
                            metrics={**metrics, "k_lr": k * ctx.train.lr_at(ctx.rnd)},
                            extras={"delta_c": sent_vectors(dc)})

    def aggregate(self, ctx: ServerContext):
        keys = self.param_keys(ctx)
        theta_g = vectors64(ctx.global_arrays, keys)
        deltas = [sub(vectors64(r.arrays, keys), theta_g) for r in ctx.results]
        alpha = float(ctx.broadcast["alpha"]["alpha"]) if "alpha" in ctx.broadcast else self.alpha0
        m_old = (torch.cat([v.reshape(-1) for v in vectors64(ctx.broadcast["momentum"], keys).values()])
                 if "momentum" in ctx.broadcast else None)
        sims = [similarity(torch.cat([d[k].reshape(-1) for k in keys]), m_old) for d in deltas]
        alpha = 0.99 * alpha + 0.01 * clipped(float(np.mean(sims)))
        server_control_update(ctx)
        w = self.weights(ctx)
        k_lr = [float(r.metrics["k_lr"]) for r in ctx.results]
        decay = ctx.train.lr_decay
        # -sum_i (w_i d_i / (K lr)_i) * decay, summed in client order from 0 as Python's sum()
        total: dict = {}
        for wi, d, kl in zip(w, deltas, k_lr, strict=True):
            term = div(mul(d, float(wi)), kl)  # d holds exactly the param keys
            if total:
                add_(total, term)
            else:
                total = add(term, 0)
        momentum = mul(neg(total), decay)
        ctx.broadcast["momentum"] = cast_like(momentum, ctx.global_arrays, torch.float32)
        ctx.broadcast["alpha"] = {"alpha": torch.tensor(alpha, dtype=torch.float64)}
        return super().aggregate(ctx)


def clipped(value: float) -> float:
    """max(0.1, min([value, 0.9])) as server/FedWMSAM.py:43 writes it, with Python's min and max, value
    first: a NaN (a diverged client's update) gives 0.1, where np.clip would give NaN and make alpha NaN
    for good."""
    return max(0.1, min([value, 0.9]))


def similarity(a: torch.Tensor, b: torch.Tensor | None) -> float:
    """v = 1 + cos(a, b); 0 when either vector is zero (or absent), as the reference computes it."""
    if b is None:
        return 0.0
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    return 0.0 if na == 0 or nb == 0 else float(torch.dot(a, b.to(a.device))) / (na * nb) + 1.0
