"""FedSAM (Qu et al., ICML 2022; Caldarola et al., ECCV 2022).

Client: sharpness-aware local steps: gradient g at theta, ascent e = rho * g/||g||,
then the gradient at theta + e is used for the SGD step at theta.
Server: FedAvg.
"""

from fedmedbench.fl.api.method import ClientContext, Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._perturb import SamAscent
from fedmedbench.fl.methods._sgd import ServerOptMethod, StepHooks


class SAMMixin:
    rho: float

    @property
    def sam_perturb(self) -> SamAscent:
        """The per-step perturbation e = rho * g/||g|| at the step's batch."""
        return SamAscent(self.rho)


@register_method("fedsam")
class FedSAM(SAMMixin, ServerOptMethod):
    params = (Param("rho", float, 0.1, "SAM ascent radius", low=0),)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.rho = float(self.p["rho"])

    def hooks(self, ctx: ClientContext) -> StepHooks:
        return StepHooks(perturb=self.sam_perturb)
