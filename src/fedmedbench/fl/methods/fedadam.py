"""FedAdam (Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Algorithm 2), as Flower's FedAdam.

Client: E local epochs of SGD from the global model, as FedAvg (Flower's eta_l is ``train.lr``).
Server (round t = 1, 2, ...; m_0 = v_0 = 0; ``_fedopt.py``):
    Delta_t = sum_i p_i theta_i - theta
    m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t
    v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2
    theta <- theta + eta_t m_t / (sqrt(v_t) + tau)
``bias_correction``: ``flower`` (default) eta_t = eta sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)), Flower's
step (flwr 1.41 server/strategy/fedadam.py:179-183: the exponent is the round + 1); ``none`` eta_t = eta,
the paper's Algorithm 2. Defaults: Flower's (fedadam.py:107-111).
"""

from __future__ import annotations

from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._fedopt import FedOpt
from fedmedbench.fl.methods._sgd import Tensors, add, mul

BIAS_CORRECTIONS = ("flower", "none")


@register_method("fedadam")
class FedAdam(FedOpt):
    params = (Param("eta", float, 0.1, "server learning rate eta", low=0, low_open=True),
              Param("beta_1", float, 0.9, "first-moment decay beta_1", low=0, high=1, high_open=True),
              Param("beta_2", float, 0.99, "second-moment decay beta_2", low=0, high=1, high_open=True),
              Param("tau", float, 1e-9, "adaptivity tau, added to sqrt(v)", low=0, low_open=True),
              Param("bias_correction", str, "flower", "flower: Flower's eta sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)); "
                    "none: eta (the paper)", choices=BIAS_CORRECTIONS))

    def second_moment(self, v: Tensors, delta_sq: Tensors) -> Tensors:
        beta_2 = float(self.p["beta_2"])
        return add(mul(v, beta_2), mul(delta_sq, 1.0 - beta_2))

    def step_size(self, rnd: int) -> float:
        eta = float(self.p["eta"])
        if self.p["bias_correction"] == "none":
            return eta
        beta_1, beta_2 = float(self.p["beta_1"]), float(self.p["beta_2"])
        return eta * (1.0 - beta_2 ** (rnd + 1.0)) ** 0.5 / (1.0 - beta_1 ** (rnd + 1.0))
