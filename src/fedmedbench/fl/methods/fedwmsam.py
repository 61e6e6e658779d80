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

from fedmedbench.fl.api import ClientContext, ClientResult, ServerContext
from fedmedbench.fl.arrays import snapshot
from fedmedbench.fl.methods._sgd import (
    PERTURBATION_FORMS,
    ServerOptMethod,
    StepHooks,
    add,
    add_,
    arrays_to_vector,
    div,
    in_form_of,
    indexed_perturbation,
    local_iterations,
    local_loop_metrics,
    mul,
    neg,
    sam_perturbation,
    sent_vectors,
    sub,
    to_tensors,
    trainable,
    vectors64,
)
from fedmedbench.fl.methods.scaffold import control_correction, server_control_update, updated_control
from fedmedbench.fl.registry import register_method


@register_method("fedwmsam")
class FedWMSAM(ServerOptMethod):
    extra_records = ("delta_c",)
    device_arrays = True

    def __init__(self, rho: float = 0.1, alpha: float = 0.1, perturbation_sign: int = -1,
                 local_iterations: str = "reference", perturbation_form: str = "reference", **params) -> None:
        super().__init__(**params)
        if rho < 0 or not 0 < alpha < 1 or perturbation_sign not in (-1, 1):
            raise ValueError(f"fedwmsam: need rho >= 0, 0 < alpha < 1, sign in (-1, 1); got {rho}, {alpha}, {perturbation_sign}")
        if local_iterations not in ("reference", "per_client"):
            raise ValueError(f"fedwmsam: local_iterations must be reference or per_client, got '{local_iterations}'")
        if perturbation_form not in PERTURBATION_FORMS:
            raise ValueError(f"fedwmsam: perturbation_form must be one of {PERTURBATION_FORMS}, got '{perturbation_form}'")
        self.rho, self.alpha0, self.sign = float(rho), float(alpha), int(perturbation_sign)
        self.k_form, self.form = local_iterations, perturbation_form

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        like = trainable(ctx.model)
        alpha = float(ctx.broadcast["alpha"]["alpha"]) if "alpha" in ctx.broadcast else self.alpha0
        c, c_i, corr = control_correction(ctx)
        m = arrays_to_vector(ctx.broadcast["momentum"]) if "momentum" in ctx.broadcast else {
            n: torch.zeros_like(t) for n, t in corr.items()}
        m_i = {n: t.to(ctx.device) for n, t in add({n: m[n] for n in like}, div(mul(corr, alpha), 1 - alpha)).items()}
        target = snapshot(to_tensors(ctx.global_arrays, like), ctx.device)  # advanced in place: a copy

        order = list(like)

        def perturb(model, xb, yb):
            if self.form == "reference":
                return indexed_perturbation((target[n] - like[n].detach() for n in order), order, self.sign * self.rho)
            d = {n: target[n] - p.detach() for n, p in like.items()}
            return sam_perturbation(d, self.sign * self.rho)

        def advance_target():
            add_(target, m_i)

        hooks = StepHooks(perturb=perturb, correction=mul(m_i, 1 - alpha),
                          loss_weight=alpha, after_step=advance_target)
        metrics = local_loop_metrics(ctx, hooks)
        k = local_iterations(ctx, self.k_form)
        ctx.state["c_i"], dc = updated_control(ctx, c, c_i, k)
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train,
                            metrics={**metrics, "k_lr": k * ctx.train.lr_at(ctx.rnd)},
                            extras={"delta_c": sent_vectors(ctx, dc)})

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
        ctx.broadcast["momentum"] = in_form_of(momentum, ctx.global_arrays, torch.float32)
        ctx.broadcast["alpha"] = {"alpha": np.asarray(alpha, dtype=np.float64)}
        return super().aggregate(ctx)


def clipped(value: float) -> float:
    """max(0.1, min([value, 0.9])) as server/FedWMSAM.py:43 writes it, with Python's min and max, value
    first: a NaN (a diverged client's update) gives 0.1, where np.clip would give NaN and make alpha NaN
    for good."""
    return max(0.1, min([value, 0.9]))


def similarity(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor | None) -> float:
    """v = 1 + cos(a, b); 0 when either vector is zero (or absent), as the reference computes it."""
    if b is None:
        return 0.0
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    return 0.0 if na == 0 or nb == 0 else float(torch.dot(a, b.to(a.device))) / (na * nb) + 1.0
