"""FedSAM (Qu et al., ICML 2022; Caldarola et al., ECCV 2022).

Client: sharpness-aware local steps: gradient g at theta, ascent e = rho * g/||g||,
then the gradient at theta + e is used for the SGD step at theta.
Server: FedAvg.
"""

from fedmedbench.fl.api import ClientContext
from fedmedbench.fl.methods._sgd import ServerOptMethod, StepHooks, gradient_at, sam_perturbation
from fedmedbench.fl.registry import register_method


class SAMMixin:
    rho: float

    def sam_perturb(self, model, xb, yb):
        return sam_perturbation(gradient_at(model, xb, yb), self.rho)


@register_method("fedsam")
class FedSAM(SAMMixin, ServerOptMethod):
    device_arrays = True

    def __init__(self, rho: float = 0.1, **params) -> None:
        super().__init__(**params)
        if rho < 0:
            raise ValueError(f"fedsam: rho must be >= 0, got {rho}")
        self.rho = float(rho)

    def hooks(self, ctx: ClientContext) -> StepHooks:
        return StepHooks(perturb=self.sam_perturb)
