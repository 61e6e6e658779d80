"""FedLESAM (Fan et al., ICML 2024): locally estimated global perturbation.

Client: the SAM perturbation direction is the *global* one, estimated without an
extra backward pass: e = rho * d/||d||, constant over the round, with
    estimate="last_update" (default; the early-stopping paper's server/FedLESAM.py and
        optimizer/LESAM.py): d = -(theta_g^{t-1} -> theta_g^t update), broadcast by the
        server (no perturbation in the first round);
    estimate="previous_global" (the FedLESAM paper): d = theta_prev - theta_g, the
        difference between the global model the client received at its previous
        participation and the current one (kept in the client's state; no perturbation
        the first time a client participates).
One gradient per step at theta + e, then the step at theta.
Server: FedAvg (and broadcasts the last global update for estimate="last_update").
"""

from __future__ import annotations

import numpy as np

from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    StepHooks,
    arrays_to_vector,
    flat_norm,
    local_loop_metrics,
    to_tensors,
    trainable,
)
from fedmedbench.fl.registry import ClientContext, ClientResult, ServerContext, model_arrays, register_method

ESTIMATES = ("previous_global", "last_update")


@register_method("fedlesam")
class FedLESAM(ServerOptMethod):
    def __init__(self, rho: float = 0.1, estimate: str = "last_update", **params) -> None:
        super().__init__(**params)
        if rho < 0:
            raise ValueError(f"fedlesam: rho must be >= 0, got {rho}")
        if estimate not in ESTIMATES:
            raise ValueError(f"fedlesam: estimate must be one of {ESTIMATES}, got '{estimate}'")
        self.rho, self.estimate = float(rho), estimate

    def direction(self, ctx: ClientContext) -> dict | None:
        like = trainable(ctx.model)
        if self.estimate == "last_update":
            if "last_update" not in ctx.broadcast:
                return None
            return {n: -t for n, t in arrays_to_vector(ctx.broadcast["last_update"]).items()}
        theta_g = to_tensors(ctx.global_arrays, like)
        prev = ctx.state.get("prev_global")
        ctx.state["prev_global"] = theta_g
        if prev is None:
            return None
        return {n: prev[n] - theta_g[n] for n in like}

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        d = self.direction(ctx)
        perturb = None
        if d is not None and float(flat_norm(d)) > 0:
            e = {n: (t * (self.rho / (flat_norm(d) + 1e-7))).to(ctx.device) for n, t in d.items()}
            perturb = lambda model, xb, yb: e  # noqa: E731 - constant over the round
        metrics = local_loop_metrics(ctx, StepHooks(perturb=perturb))
        return ClientResult(arrays=model_arrays(ctx.model), num_examples=ctx.data.num_train, metrics=metrics)

    def aggregate(self, ctx: ServerContext):
        new = super().aggregate(ctx)
        if self.estimate == "last_update":
            ctx.broadcast["last_update"] = {
                k: (new[k].astype(np.float64) - ctx.global_arrays[k].astype(np.float64)).astype(np.float32)
                for k in self.param_keys(ctx)}
        return new
