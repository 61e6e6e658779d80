"""FedSMOO (Sun et al., ICML 2023), reference-code form.

Client i keeps a dynamic dual mu_i (state) and FedDyn's h_i. Each step: gradient g
at theta; g' = g - (mu_i + s) with s the server's global dual correction; the
perturbation is e = rho * g'/||g'||; mu_i += e - s; the step uses the gradient at
theta + e plus FedDyn's prox-correction lambda*(h_i - theta_g) (decay lambda).
The client sends theta_i and mu_i.
Server: FedDyn's theta update; s = rho * mean(mu_i)/||mean(mu_i)|| over the sampled
clients (broadcast).
"""

from __future__ import annotations

import numpy as np

from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    arrays_to_vector,
    flat_norm,
    gradient_at,
    local_loop_metrics,
    state_tensors,
    tensors_to_arrays,
    trainable,
)
from fedmedbench.fl.methods.feddyn import dyn_client_update, dyn_hooks, dyn_server_update
from fedmedbench.fl.registry import ClientContext, ClientResult, ServerContext, model_arrays, register_method


@register_method("fedsmoo")
class FedSMOO(ServerOptMethod):
    extra_records = ("mu",)

    def __init__(self, rho: float = 0.1, lamb: float = 0.1, **params) -> None:
        super().__init__(**params)
        if rho < 0 or lamb <= 0:
            raise ValueError(f"fedsmoo: need rho >= 0 and lamb > 0, got rho={rho}, lamb={lamb}")
        self.rho, self.lamb = float(rho), float(lamb)

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        like = {n: p.detach().cpu() for n, p in trainable(ctx.model).items()}
        mu = {n: t.to(ctx.device) for n, t in state_tensors(ctx.state, "mu_i", like).items()}
        s = arrays_to_vector(ctx.broadcast["s"]) if "s" in ctx.broadcast else {n: t * 0 for n, t in like.items()}
        s = {n: t.to(ctx.device) for n, t in s.items()}

        def perturb(model, xb, yb):
            g = gradient_at(model, xb, yb)
            g = {n: g[n] - (mu[n] + s[n]) for n in g}
            e = {n: t * (self.rho / (flat_norm(g) + 1e-7)) for n, t in g.items()}
            for n in e:
                mu[n] += e[n] - s[n]
            return e

        hooks, h_i = dyn_hooks(ctx, self.lamb)
        hooks.perturb = perturb
        metrics = local_loop_metrics(ctx, hooks)
        dyn_client_update(ctx, h_i)
        ctx.state["mu_i"] = {n: t.detach().cpu() for n, t in mu.items()}
        return ClientResult(arrays=model_arrays(ctx.model), num_examples=ctx.data.num_train,
                            metrics=metrics, extras={"mu": tensors_to_arrays(ctx.state["mu_i"])})

    def aggregate(self, ctx: ServerContext):
        mus = [r.extras["mu"] for r in ctx.results]
        mean = {k: np.mean([m[k] for m in mus], axis=0, dtype=np.float64) for k in mus[0]}
        norm = float(np.sqrt(sum((v**2).sum() for v in mean.values()))) + 1e-7
        ctx.broadcast["s"] = {k: (v / norm * self.rho).astype(np.float32) for k, v in mean.items()}
        return dyn_server_update(self, ctx)
