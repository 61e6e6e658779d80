"""FedProx (Li et al., MLSys 2020) as a user's own method, through the loss hook of ``Method``.

Client: local SGD on CE(theta) + mu/2 ||theta - theta_g||^2 (theta_g: the global model this round started from).
Server: FedAvg (``Method``'s weighted average). Register it in the config (README "Your own method"):
``methods: {fedprox_hook: examples/methods/fedprox_hook.py}``; it trains as the built-in ``fedprox``.
"""

from __future__ import annotations

from fedmedbench.fl.api import Method, Param, register_method


@register_method("fedprox_hook")
class FedProxHook(Method):
    params = (Param("mu", float, 0.1, "proximal weight mu", low=0),)

    def extra_loss(self, ctx, model, x, y, logits):
        """mu/2 ||theta - theta_g||^2 over the trainable parameters, added to every local step's loss."""
        sq = [(p - ctx.global_arrays[n].to(p)).pow(2).sum() for n, p in model.named_parameters() if p.requires_grad]
        return self.p["mu"] / 2 * sum(sq)
