"""FedSpeed (Sun et al., ICLR 2023), reference-code form.

Client: SAM-perturbed local gradients (as FedSAM) plus the prox-correction of the
dual variable h_i (as FedDyn: lambda*(h_i - theta_g) and decay lambda); h_i += update.
Server: FedDyn's: h += sum of updates / N, theta = mean(theta_i) + h.
"""

from fedmedbench.fl.api import ClientContext, ClientResult, ServerContext
from fedmedbench.fl.methods._sgd import ServerOptMethod, local_loop_metrics
from fedmedbench.fl.methods.feddyn import dyn_client_update, dyn_hooks, dyn_server_update
from fedmedbench.fl.methods.fedsam import SAMMixin
from fedmedbench.fl.registry import register_method


@register_method("fedspeed")
class FedSpeed(SAMMixin, ServerOptMethod):
    device_arrays = True

    def __init__(self, rho: float = 0.1, lamb: float = 0.1, **params) -> None:
        super().__init__(**params)
        if rho < 0 or lamb <= 0:
            raise ValueError(f"fedspeed: need rho >= 0 and lamb > 0, got rho={rho}, lamb={lamb}")
        self.rho, self.lamb = float(rho), float(lamb)

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        hooks, h_i = dyn_hooks(ctx, self.lamb)
        hooks.perturb = self.sam_perturb
        metrics = local_loop_metrics(ctx, hooks)
        dyn_client_update(ctx, h_i)
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train, metrics=metrics)

    def aggregate(self, ctx: ServerContext):
        return dyn_server_update(self, ctx)
