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

from fedmedbench.fl.api.method import ClientContext, ClientResult, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._sgd import (
    LOCAL_ITERATIONS,
    ServerOptMethod,
    StepHooks,
    add,
    add_,
    arrays_to_vector,
    client_tensors,
    delta,
    div,
    local_iterations,
    sent_vectors,
    state_tensors,
    sub,
    trained_params,
)


def control_correction(ctx: ClientContext, c_name: str = "c") -> tuple[dict, dict, dict]:
    """(c, c_i, c - c_i) for this client; c from the broadcast (zeros before the first update)."""
    like = client_tensors(ctx)
    c = arrays_to_vector(ctx.broadcast[c_name]) if c_name in ctx.broadcast else {n: t * 0 for n, t in like.items()}
    c_i = state_tensors(ctx.state, "c_i", like)
    return c, c_i, sub(c, c_i)


def updated_control(ctx: ClientContext, c: dict, c_i: dict, k: float, trained: dict) -> tuple[dict, dict]:
    """Option II: c_i+ = c_i - c + (theta_g - theta_i) / (K lr); returns (c_i+, delta_c). ``trained``: theta_i
    (:func:`trained_params`)."""
    d = delta(trained, ctx.global_arrays)
    k_lr = k * ctx.train.lr_at(ctx.rnd)
    new = sub(sub({n: c_i[n] for n in d}, c), div(d, k_lr))
    return new, sub(new, c_i)


def server_control_update(ctx: ServerContext, name: str = "c") -> None:
    """c <- c + sum_i delta_c_i / N, kept in the broadcast."""
    deltas = [r.extras["delta_c"] for r in ctx.results]
    old = ctx.broadcast.get(name) or {k: v * 0 for k, v in deltas[0].items()}
    total = add(deltas[0], 0)  # as sum(): 0 + the first, then the others in order
    for d in deltas[1:]:
        add_(total, d)
    ctx.broadcast[name] = {k: v.to(torch.float32) for k, v in add(old, div(total, ctx.num_clients)).items()}


@register_method("scaffold")
class Scaffold(ServerOptMethod):
    extra_records = ("delta_c",)
    params = (Param("local_iterations", str, "reference", "K of the control-variate update: reference (E n_0 / B) or per_client", choices=LOCAL_ITERATIONS),)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.k_form = self.p["local_iterations"]

    def perturbation(self):
        """Per-step weight perturbation (none here; FedGAMMA adds SAM's)."""
        return None

    def hooks(self, ctx: ClientContext) -> StepHooks:
        c, c_i, corr = control_correction(ctx)
        return StepHooks(perturb=self.perturbation(), correction=corr, keep={"c": c, "c_i": c_i})

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics, arrays) -> ClientResult:
        k = local_iterations(ctx, self.k_form)
        ctx.state["c_i"], dc = updated_control(ctx, hooks.keep["c"], hooks.keep["c_i"], k, trained_params(ctx, arrays))
        return ClientResult(arrays=arrays, num_examples=ctx.data.num_train, metrics=metrics,
                            extras={"delta_c": sent_vectors(dc)})

    def aggregate(self, ctx: ServerContext):
        server_control_update(ctx)
        return super().aggregate(ctx)
