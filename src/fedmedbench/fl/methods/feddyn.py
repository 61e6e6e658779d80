"""FedDyn (Acar et al., ICLR 2021), in the reference-code (FL-Simulator) form.

Client i keeps h_i = sum of its past local updates (theta_i - theta_g); its local
objective is  CE(theta) + lambda * <theta, h_i - theta_g> + lambda/2 ||theta||^2,
i.e. the gradient  g + lambda*(theta - theta_g) + lambda*h_i: the dynamic regulariser
of FedDyn with its linear term -<grad L_i(theta_i^{t-1}), theta> = lambda*<h_i, theta>.
After training, h_i += theta_i - theta_g.
Server (state h = mean over ALL N clients of h_i, updated from the sampled clients'
updates):  h += sum_i (theta_i - theta_g) / N;  theta_g = mean(theta_i) + h.
This equals FedDyn's  theta = mean(theta_i) - h_server/alpha  with alpha = lambda.
"""

from __future__ import annotations

import torch

from fedmedbench.fl.api.method import Arrays, ClientContext, ClientResult, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    StepHooks,
    add,
    add_,
    cast_like,
    client_tensors,
    delta,
    div,
    mul,
    state_tensors,
    sub,
    to_tensors,
    trained_params,
    vectors64,
)


def dyn_hooks(ctx: ClientContext, lamb: float) -> StepHooks:
    """FedDyn's step: correction lamb * (h_i - theta_g) and extra decay lamb; h_i kept for ``dyn_client_update``."""
    like = client_tensors(ctx)
    h_i = state_tensors(ctx.state, "h_i", like)
    theta_g = to_tensors(ctx.global_arrays, like)
    return StepHooks(correction=mul(sub(h_i, theta_g), lamb), extra_weight_decay=lamb, keep={"h_i": h_i})


def dyn_client_update(ctx: ClientContext, h_i: dict, trained: dict) -> None:
    """h_i += theta_i - theta_g (``trained``: theta_i, :func:`trained_params`)."""
    d = delta(trained, ctx.global_arrays)
    ctx.state["h_i"] = add({n: h_i[n] for n in d}, d)


def dyn_server_update(method: ServerOptMethod, ctx: ServerContext) -> Arrays:
    """h += sum of sampled updates / N; theta = mean(theta_i) + h (params); buffers averaged.
    h (float64) is kept in the server state where the arrays are."""
    keys = method.param_keys(ctx)
    theta_g = vectors64(ctx.global_arrays, keys)
    stored = ctx.state.get("h")
    h = {k: torch.zeros_like(v) for k, v in theta_g.items()} if stored is None else {
        k: stored[k].to(theta_g[k].device, torch.float64, copy=True) for k in keys}
    for r in ctx.results:
        add_(h, div(sub(vectors64(r.arrays, keys), theta_g), ctx.num_clients))
    ctx.state["h"] = h
    out = dict(method.average(ctx))
    mean = vectors64(out, keys)
    out.update(cast_like(add(mean, h), out))
    return out


@register_method("feddyn")
class FedDyn(ServerOptMethod):
    params = (Param("lamb", float, 0.1, "dynamic-regulariser weight lambda", low=0, low_open=True),)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.lamb = float(self.p["lamb"])

    def hooks(self, ctx: ClientContext) -> StepHooks:
        return dyn_hooks(ctx, self.lamb)

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics, arrays) -> ClientResult:
        dyn_client_update(ctx, hooks.keep["h_i"], trained_params(ctx, arrays))
        return super().client_result(ctx, hooks, metrics, arrays)

    def aggregate(self, ctx: ServerContext) -> Arrays:
        return dyn_server_update(self, ctx)
