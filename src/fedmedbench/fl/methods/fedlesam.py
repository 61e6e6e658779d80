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

from fedmedbench.fl.api import ClientContext, ClientResult, ServerContext
from fedmedbench.fl.methods._sgd import (
    PERTURBATION_FORMS,
    ServerOptMethod,
    StepHooks,
    arrays_to_vector,
    client_tensors,
    flat_norm,
    in_form_of,
    indexed_perturbation,
    local_loop_metrics,
    neg,
    sam_perturbation,
    sub,
    to_tensors,
    trainable,
    vectors64,
)
from fedmedbench.fl.registry import register_method

ESTIMATES = ("previous_global", "last_update")


@register_method("fedlesam")
class FedLESAM(ServerOptMethod):
    device_arrays = True

    def __init__(self, rho: float = 0.1, estimate: str = "last_update", perturbation_form: str = "reference",
                 **params) -> None:
        super().__init__(**params)
        if rho < 0:
            raise ValueError(f"fedlesam: rho must be >= 0, got {rho}")
        if estimate not in ESTIMATES:
            raise ValueError(f"fedlesam: estimate must be one of {ESTIMATES}, got '{estimate}'")
        if perturbation_form not in PERTURBATION_FORMS:
            raise ValueError(f"fedlesam: perturbation_form must be one of {PERTURBATION_FORMS}, got '{perturbation_form}'")
        self.rho, self.estimate, self.form = float(rho), estimate, perturbation_form

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

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        d = self.direction(ctx)
        perturb = None
        if d is not None and float(flat_norm(d)) > 0:
            if self.form == "reference":
                order = list(trainable(ctx.model))
                e = {n: t.to(ctx.device) for n, t in indexed_perturbation((d[n] for n in order), order, self.rho).items()}
            else:
                e = {n: t.to(ctx.device) for n, t in sam_perturbation(d, self.rho).items()}
            perturb = lambda model, xb, yb: e  # noqa: E731 - constant over the round
        metrics = local_loop_metrics(ctx, StepHooks(perturb=perturb))
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train, metrics=metrics)

    def aggregate(self, ctx: ServerContext):
        new = super().aggregate(ctx)
        if self.estimate == "last_update":
            keys = self.param_keys(ctx)
            new64, old64 = vectors64(new, keys), vectors64(ctx.global_arrays, keys)
            ctx.broadcast["last_update"] = in_form_of(sub(new64, old64), new, torch.float32)
        return new
