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

from fedmedbench.fl.api.method import ClientContext, ClientResult, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._perturb import BatchedPerturbation, Perturbation
from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    StepHooks,
    Tensors,
    add,
    add_,
    arrays_to_vector,
    cast_like,
    client_tensors,
    div,
    gradient_at,
    kept_vectors,
    mul,
    sam_perturbation,
    sent_vectors,
    state_tensors,
    sub,
    trained_params,
    vectors64,
)
from fedmedbench.fl.methods.feddyn import dyn_client_update, dyn_hooks, dyn_server_update


class DualAscent(Perturbation):
    """FedSMOO's ascent at each step: g' = g - (mu_i + s) from the gradient g at the current weights,
    e = rho * g'/||g'||, and mu_i += e - s (``mu``: the client's dual, updated in place)."""

    shared = ("rho",)  # the batched form's one rho
    every_client = True  # the batched form writes every client's mu back

    def __init__(self, rho: float, mu: Tensors, s: Tensors) -> None:
        self.rho, self.mu, self.s = rho, mu, s

    def __call__(self, model, xb, yb) -> Tensors:
        g = gradient_at(model, xb, yb)
        g = sub(g, add({n: self.mu[n] for n in g}, self.s))
        e = sam_perturbation(g, self.rho)  # one norm per step, not one per tensor
        add_({n: self.mu[n] for n in e}, sub(e, self.s))
        return e

    @classmethod
    def batched(cls, perturbs, stack) -> BatchedPerturbation:
        return _BatchedDualAscent(perturbs, stack)


class _BatchedDualAscent(BatchedPerturbation):
    needs_gradient = True

    def __init__(self, perturbs: list[DualAscent], stack) -> None:
        self.perturbs, self.stack, self.rho = perturbs, stack, perturbs[0].rho
        self.mu = stack.stacked([p.mu for p in perturbs])
        self.s = stack.stacked([p.s for p in perturbs])

    def e(self, weights, grads, n):
        mu, s = self.stack.first(self.mu, n), self.stack.first(self.s, n)  # the others' mu stays
        g = torch._foreach_sub(grads, torch._foreach_add(mu, s))
        e = self.stack.sam(g, self.rho)
        torch._foreach_add_(mu, torch._foreach_sub(e, s))
        return e

    def finish(self) -> None:
        for p, row in zip(self.perturbs, self.stack.rows(self.mu), strict=True):
            p.mu.update(row)


@register_method("fedsmoo")
class FedSMOO(ServerOptMethod):
    extra_records = ("mu",)

    params = (Param("rho", float, 0.1, "SAM ascent radius", low=0), Param("lamb", float, 0.1, "dynamic-regulariser weight lambda", low=0, low_open=True))

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.rho, self.lamb = float(self.p["rho"]), float(self.p["lamb"])

    def hooks(self, ctx: ClientContext) -> StepHooks:
        like = client_tensors(ctx)
        mu = {n: t.to(ctx.device) for n, t in state_tensors(ctx.state, "mu_i", like).items()}
        s = arrays_to_vector(ctx.broadcast["s"]) if "s" in ctx.broadcast else {n: t * 0 for n, t in like.items()}
        hooks = dyn_hooks(ctx, self.lamb)
        hooks.perturb = DualAscent(self.rho, mu, {n: t.to(ctx.device) for n, t in s.items()})
        return hooks

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics, arrays) -> ClientResult:
        dyn_client_update(ctx, hooks.keep["h_i"], trained_params(ctx, arrays))
        ctx.state["mu_i"] = kept_vectors(ctx, hooks.perturb.mu)
        return ClientResult(arrays=arrays, num_examples=ctx.data.num_train, metrics=metrics,
                            extras={"mu": sent_vectors(ctx.state["mu_i"])})

    def aggregate(self, ctx: ServerContext):
        """s = rho * mean(mu_i) / ||mean(mu_i)|| over the sampled clients, then FedDyn's step."""
        first = ctx.results[0].extras["mu"]
        mus = [vectors64(r.extras["mu"], first) for r in ctx.results]
        total = add(mus[0], 0)  # as sum(): 0 + the first, then the others in order
        for m in mus[1:]:
            add_(total, m)
        mean = div(total, len(mus))
        norm = float(torch.sqrt(sum(sq.sum() for sq in torch._foreach_mul(list(mean.values()), list(mean.values()))))) + 1e-7
        ctx.broadcast["s"] = cast_like(mul(div(mean, norm), self.rho), first, torch.float32)
        return dyn_server_update(self, ctx)
