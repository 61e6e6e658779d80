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

import torch

from fedmedbench.fl.api import ClientContext, ClientResult, ServerContext
from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    add,
    add_,
    arrays_to_vector,
    client_tensors,
    div,
    gradient_at,
    in_form_of,
    kept_vectors,
    local_loop_metrics,
    mul,
    sam_perturbation,
    sent_vectors,
    state_tensors,
    sub,
    vectors64,
)
from fedmedbench.fl.methods.feddyn import dyn_client_update, dyn_hooks, dyn_server_update
from fedmedbench.fl.registry import register_method


@register_method("fedsmoo")
class FedSMOO(ServerOptMethod):
    extra_records = ("mu",)
    device_arrays = True

    def __init__(self, rho: float = 0.1, lamb: float = 0.1, **params) -> None:
        super().__init__(**params)
        if rho < 0 or lamb <= 0:
            raise ValueError(f"fedsmoo: need rho >= 0 and lamb > 0, got rho={rho}, lamb={lamb}")
        self.rho, self.lamb = float(rho), float(lamb)

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        like = client_tensors(ctx)
        mu = {n: t.to(ctx.device) for n, t in state_tensors(ctx.state, "mu_i", like).items()}
        s = arrays_to_vector(ctx.broadcast["s"]) if "s" in ctx.broadcast else {n: t * 0 for n, t in like.items()}
        s = {n: t.to(ctx.device) for n, t in s.items()}

        def perturb(model, xb, yb):
            g = gradient_at(model, xb, yb)
            g = sub(g, add({n: mu[n] for n in g}, s))
            e = sam_perturbation(g, self.rho)  # one norm per step, not one per tensor
            add_({n: mu[n] for n in e}, sub(e, s))
            return e

        hooks, h_i = dyn_hooks(ctx, self.lamb)
        hooks.perturb = perturb
        metrics = local_loop_metrics(ctx, hooks)
        dyn_client_update(ctx, h_i)
        ctx.state["mu_i"] = kept_vectors(ctx, mu)
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train,
                            metrics=metrics, extras={"mu": sent_vectors(ctx, ctx.state["mu_i"])})

    def aggregate(self, ctx: ServerContext):
        """s = rho * mean(mu_i) / ||mean(mu_i)|| over the sampled clients, then FedDyn's step."""
        first = ctx.results[0].extras["mu"]
        mus = [vectors64(r.extras["mu"], first) for r in ctx.results]
        total = add(mus[0], 0)  # as sum(): 0 + the first, then the others in order
        for m in mus[1:]:
            add_(total, m)
        mean = div(total, len(mus))
        norm = float(torch.sqrt(sum(sq.sum() for sq in torch._foreach_mul(list(mean.values()), list(mean.values()))))) + 1e-7
        ctx.broadcast["s"] = in_form_of(mul(div(mean, norm), self.rho), first, torch.float32)
        return dyn_server_update(self, ctx)
