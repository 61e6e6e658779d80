"""FedGAMMA (Dai et al., IEEE TNNLS 2023), reference-code form.

Client: SAM-perturbed local gradients plus SCAFFOLD's control-variate correction
(c - c_i); c_i updated as SCAFFOLD option II and delta_c_i sent.
Server: SCAFFOLD's (global lr on the averaged update; c += sum delta_c_i / N).
So FedGAMMA is SCAFFOLD whose local steps take the gradient at the SAM point.
"""

from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods.fedsam import SAMMixin
from fedmedbench.fl.methods.scaffold import Scaffold


@register_method("fedgamma")
class FedGamma(SAMMixin, Scaffold):
    params = (Param("rho", float, 0.1, "SAM ascent radius", low=0),)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.rho = float(self.p["rho"])

    def perturbation(self):
        return self.sam_perturb
