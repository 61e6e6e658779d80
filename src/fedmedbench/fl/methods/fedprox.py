"""FedProx (Li et al., MLSys 2020).

Client: minimise  CE(theta) + mu/2 * ||theta - theta_g||^2  by local SGD. As in the
reference code the proximal gradient mu*(theta - theta_g) is split into extra weight
decay mu*theta and a constant correction -mu*theta_g. With mu = 0 this is FedAvg.
Server: FedAvg.
"""

from fedmedbench.fl.api.method import ClientContext, Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._sgd import ServerOptMethod, StepHooks, mul, to_tensors, trainable


@register_method("fedprox")
class FedProx(ServerOptMethod):
    params = (Param("mu", float, 0.1, "proximal weight mu", low=0),)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.mu = float(self.p["mu"])

    def hooks(self, ctx: ClientContext) -> StepHooks:
        anchor = to_tensors(ctx.global_arrays, trainable(ctx.model))
        return StepHooks(correction=mul(anchor, -self.mu), extra_weight_decay=self.mu)
