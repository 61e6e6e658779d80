"""FedLESAM (Fan et al., ICML 2024): locally estimated global perturbation.

Client: the SAM perturbation direction is the *global* one, estimated without an
extra backward pass from a direction d, constant over the round, with
    estimate="last_update" (default; the early-stopping paper's server/FedLESAM.py and
        optimizer/LESAM.py): d = -(theta_g^{t-1} -> theta_g^t update), broadcast by the
        server (no perturbation in the first round);
    estimate="previous_global" (the FedLESAM paper): d = theta_prev - theta_g, the
        difference between the global model the client received at its previous
        participation and the current one (kept in the client's state; no perturbation
        the first time a client participates).
The perturbation made of d (``perturbation_form``):
    "reference" (default; optimizer/LESAM.py indexes the flat update by parameter position):
        parameter tensor j moves as a whole by rho * d[j] / sum_k |d[k]|, d flattened in
        parameter order, k over the P parameter tensors (see ``indexed_perturbation``);
    "vector" (the FedLESAM paper): e = rho * d/||d||.
One gradient per step at theta + e, then the step at theta.
Server: FedAvg (and broadcasts the last global update for estimate="last_update").
"""

from __future__ import annotations

import torch

from fedmedbench.fl.api.method import ClientContext, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._perturb import FixedPerturbation
from fedmedbench.fl.methods._sgd import (
    PERTURBATION_FORMS,
    ServerOptMethod,
    StepHooks,
    arrays_to_vector,
    cast_like,
    client_tensors,
    flat_norm,
    indexed_perturbation,
    neg,
    sam_perturbation,
    sub,
    to_tensors,
    trainable,
    vectors64,
)

ESTIMATES = ("previous_global", "last_update")


@register_method("fedlesam")
class FedLESAM(ServerOptMethod):
    params = (Param("rho", float, 0.1, "SAM ascent radius", low=0),
              Param("estimate", str, "last_update", "the global update's estimate", choices=ESTIMATES),
              Param("perturbation_form", str, "reference", "per-tensor (reference) or whole-vector norm", choices=PERTURBATION_FORMS))

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.rho, self.estimate, self.form = float(self.p["rho"]), self.p["estimate"], self.p["perturbation_form"]

    def direction(self, ctx: ClientContext) -> dict | None:
        like = client_tensors(ctx)
        if self.estimate == "last_update":
            if "last_update" not in ctx.broadcast:
                return None
            return neg(arrays_to_vector(ctx.broadcast["last_update"]))
        theta_g = to_tensors(ctx.global_arrays, like)
        prev = ctx.state.get("prev_global")
        ctx.state["prev_global"] = {n: t.clone() for n, t in theta_g.items()}  # never the broadcast's own tensors
        if prev is None:
            return None
        return {n: prev[n].to(theta_g[n].device) - theta_g[n] for n in like}

    def hooks(self, ctx: ClientContext) -> StepHooks:
        d = self.direction(ctx)
        if d is None or not float(flat_norm(d)) > 0:
            return StepHooks()
        if self.form == "reference":
            order = list(trainable(ctx.model))
            e = {n: t.to(ctx.device) for n, t in indexed_perturbation((d[n] for n in order), order, self.rho).items()}
        else:
            e = {n: t.to(ctx.device) for n, t in sam_perturbation(d, self.rho).items()}
        return StepHooks(perturb=FixedPerturbation(e))  # constant over the round

    def aggregate(self, ctx: ServerContext):
        new = super().aggregate(ctx)
        if self.estimate == "last_update":
            keys = self.param_keys(ctx)
            new64, old64 = vectors64(new, keys), vectors64(ctx.global_arrays, keys)
            ctx.broadcast["last_update"] = cast_like(sub(new64, old64), new, torch.float32)
        return new
