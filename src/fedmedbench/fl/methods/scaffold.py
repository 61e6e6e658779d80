"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates.

Client i (state: its control variate c_i, zeros at first): every local step uses
the gradient g + (c - c_i), where c is the server control variate broadcast with
the model. After its local steps at learning rate lr:
    c_i+ = c_i - c + (theta_g - theta_i) / (K * lr),
and the client sends theta_i and delta_c_i = c_i+ - c_i.
Server: theta_g <- theta_g + eta_g * mean(theta_i - theta_g);  c <- c + sum_i delta_c_i / N.
K (``local_iterations``): "reference" = E * n_0 / B with n_0 client 0's training size, the
same for every client (the early-stopping paper's server/SCAFFOLD.py); "per_client" = the
steps this client took, E * ceil(n_i / B) (the SCAFFOLD paper).
"""

from __future__ import annotations

import torch

from fedmedbench.fl.api import ClientContext, ClientResult, ServerContext
from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    StepHooks,
    add,
    add_,
    arrays_to_vector,
    as_float32,
    client_tensors,
    delta,
    div,
    local_iterations,
    local_loop_metrics,
    sent_vectors,
    state_tensors,
    sub,
)
from fedmedbench.fl.registry import register_method


def control_correction(ctx: ClientContext, c_name: str = "c") -> tuple[dict, dict, dict]:
    """(c, c_i, c - c_i) for this client; c from the broadcast (zeros before the first update)."""
    like = client_tensors(ctx)
    c = arrays_to_vector(ctx.broadcast[c_name]) if c_name in ctx.broadcast else {n: t * 0 for n, t in like.items()}
    c_i = state_tensors(ctx.state, "c_i", like)
    return c, c_i, sub(c, c_i)


def updated_control(ctx: ClientContext, c: dict, c_i: dict, k: float) -> tuple[dict, dict]:
    """Option II: c_i+ = c_i - c + (theta_g - theta_i) / (K lr); returns (c_i+, delta_c)."""
    d = delta(ctx.model, ctx.global_arrays)
    k_lr = k * ctx.train.lr_at(ctx.rnd)
    new = sub(sub({n: c_i[n] for n in d}, c), div(d, k_lr))
    return new, sub(new, c_i)


def server_control_update(ctx: ServerContext, name: str = "c") -> None:
    """c <- c + sum_i delta_c_i / N, kept in the broadcast."""
    deltas = [r.extras["delta_c"] for r in ctx.results]
    old = ctx.broadcast.get(name) or {k: v * 0 for k, v in deltas[0].items()}
    if not all(isinstance(v, torch.Tensor) for d in (old, *deltas) for v in d.values()):  # NumPy arrays (host path)
        ctx.broadcast[name] = {k: as_float32(old[k] + sum(d[k] for d in deltas) / ctx.num_clients) for k in old}
        return
    total = add(deltas[0], 0)  # as sum(): 0 + the first, then the others in order
    for d in deltas[1:]:
        add_(total, d)
    ctx.broadcast[name] = {k: as_float32(v) for k, v in add(old, div(total, ctx.num_clients)).items()}


@register_method("scaffold")
class Scaffold(ServerOptMethod):
    extra_records = ("delta_c",)
    device_arrays = True

    def __init__(self, local_iterations: str = "reference", **params) -> None:
        super().__init__(**params)
        if local_iterations not in ("reference", "per_client"):
            raise ValueError(f"{self.name}: local_iterations must be reference or per_client, got '{local_iterations}'")
        self.k_form = local_iterations

    def perturbation(self):
        """Per-step weight perturbation (none here; FedGAMMA adds SAM's)."""
        return None

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        c, c_i, corr = control_correction(ctx)
        metrics = local_loop_metrics(ctx, StepHooks(perturb=self.perturbation(), correction=corr))
        ctx.state["c_i"], dc = updated_control(ctx, c, c_i, local_iterations(ctx, self.k_form))
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train,
                            metrics=metrics, extras={"delta_c": sent_vectors(ctx, dc)})

    def aggregate(self, ctx: ServerContext):
        server_control_update(ctx)
        return super().aggregate(ctx)
