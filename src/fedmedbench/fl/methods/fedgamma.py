"""FedGAMMA (Dai et al., IEEE TNNLS 2023), reference-code form.

Client: SAM-perturbed local gradients plus SCAFFOLD's control-variate correction
(c - c_i); c_i updated as SCAFFOLD option II and delta_c_i sent.
Server: SCAFFOLD's (global lr on the averaged update; c += sum delta_c_i / N).
"""

from fedmedbench.fl.methods._sgd import ServerOptMethod, StepHooks, local_loop, tensors_to_arrays
from fedmedbench.fl.methods.fedsam import SAMMixin
from fedmedbench.fl.methods.scaffold import control_correction, server_control_update, updated_control
from fedmedbench.fl.registry import ClientContext, ClientResult, ServerContext, model_arrays, register_method


@register_method("fedgamma")
class FedGamma(SAMMixin, ServerOptMethod):
    extra_records = ("delta_c",)

    def __init__(self, rho: float = 0.1, **params) -> None:
        super().__init__(**params)
        if rho < 0:
            raise ValueError(f"fedgamma: rho must be >= 0, got {rho}")
        self.rho = float(rho)

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        c, c_i, corr = control_correction(ctx)
        loss = local_loop(ctx, StepHooks(perturb=self.sam_perturb, correction=corr))
        ctx.state["c_i"], dc = updated_control(ctx, c, c_i)
        return ClientResult(arrays=model_arrays(ctx.model), num_examples=ctx.data.num_train,
                            metrics={"train_loss": loss}, extras={"delta_c": tensors_to_arrays(dc)})

    def aggregate(self, ctx: ServerContext):
        server_control_update(ctx)
        return super().aggregate(ctx)
