"""FedNova (Wang et al., NeurIPS 2020) for plain local SGD, as a user's own method in one file.

A client that takes more local steps (more data at a fixed number of epochs) moves further, and
FedAvg's average drifts towards its optimum. FedNova averages each client's update normalised by
its number of local steps tau_i, then takes the effective number of steps tau_eff:

    theta <- theta + global_lr * tau_eff * sum_i p_i (theta_i - theta) / tau_i,
    p_i = n_i / n,  tau_eff = sum_i p_i tau_i.

With equal tau_i (and global_lr 1) this is FedAvg. Register it in the config (README "Your own method"):
``methods: {fednova: examples/methods/fednova.py}``, then list ``fednova`` under a study's methods.
"""

from __future__ import annotations

import torch

from fedmedbench.fl.api import (
    Arrays,
    ClientContext,
    ClientResult,
    Method,
    Param,
    ServerContext,
    register_method,
    weighted_average,
)


@register_method("fednova")
class FedNova(Method):
    params = (Param("global_lr", float, 1.0, "server step on the normalised update", low=0, low_open=True),)

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        result = super().client_fit(ctx)  # E epochs of local SGD, as FedAvg
        result.metrics["local_steps"] = float(ctx.steps)  # tau_i, sent with the reply
        return result

    def aggregate(self, ctx: ServerContext) -> Arrays:
        n = torch.tensor([float(r.num_examples) for r in ctx.results], dtype=torch.float64)
        tau = torch.tensor([r.metrics["local_steps"] for r in ctx.results], dtype=torch.float64)
        p = n / n.sum()
        coef = (self.p["global_lr"] * (p * tau).sum() * p / tau).tolist()  # the weight of client i's update
        out = weighted_average([r.arrays for r in ctx.results], n.tolist())  # FedAvg for integer buffers
        for key, old in ctx.global_arrays.items():  # model arrays are torch tensors
            if not old.is_floating_point():
                continue
            g = old.to(torch.float64)
            step = sum(c * (r.arrays[key].to(g) - g) for c, r in zip(coef, ctx.results, strict=True))
            out[key] = (g + step).to(old.dtype)
        return out
