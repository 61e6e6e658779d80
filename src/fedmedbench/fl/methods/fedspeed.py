"""FedSpeed (Sun et al., ICLR 2023), reference-code form.

Client: SAM-perturbed local gradients (as FedSAM) plus the prox-correction of the
dual variable h_i (as FedDyn: lambda*(h_i - theta_g) and decay lambda); h_i += update.
Server: FedDyn's: h += sum of updates / N, theta = mean(theta_i) + h.
"""

from fedmedbench.fl.api.method import ClientContext, ClientResult, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._sgd import ServerOptMethod, StepHooks, trained_params
from fedmedbench.fl.methods.feddyn import dyn_client_update, dyn_hooks, dyn_server_update
from fedmedbench.fl.methods.fedsam import SAMMixin


@register_method("fedspeed")
class FedSpeed(SAMMixin, ServerOptMethod):
    params = (Param("rho", float, 0.1, "SAM ascent radius", low=0), Param("lamb", float, 0.1, "dynamic-regulariser weight lambda", low=0, low_open=True))

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.rho, self.lamb = float(self.p["rho"]), float(self.p["lamb"])

    def hooks(self, ctx: ClientContext) -> StepHooks:
        hooks = dyn_hooks(ctx, self.lamb)
        hooks.perturb = self.sam_perturb
        return hooks

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics, arrays) -> ClientResult:
        dyn_client_update(ctx, hooks.keep["h_i"], trained_params(ctx, arrays))
        return super().client_result(ctx, hooks, metrics, arrays)

    def aggregate(self, ctx: ServerContext):
        return dyn_server_update(self, ctx)
