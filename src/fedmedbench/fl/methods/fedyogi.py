"""FedYogi (Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Algorithm 2), as Flower's FedYogi.

Client: E local epochs of SGD from the global model, as FedAvg (Flower's eta_l is ``train.lr``).
Server (round t; m_0 = v_0 = 0; ``_fedopt.py``): FedAdam's step with Yogi's second moment, which grows or
shrinks v additively towards Delta^2 instead of averaging it in:
    Delta_t = sum_i p_i theta_i - theta
    m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t
    v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2)
    theta <- theta + eta m_t / (sqrt(v_t) + tau)
No bias correction (flwr 1.41 server/strategy/fedyogi.py:170-178). Defaults: Flower's (fedyogi.py:107-111).
"""

from __future__ import annotations

import torch

from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._fedopt import FedOpt
from fedmedbench.fl.methods._sgd import Tensors


@register_method("fedyogi")
class FedYogi(FedOpt):
    params = (Param("eta", float, 0.01, "server learning rate eta", low=0, low_open=True),
              Param("beta_1", float, 0.9, "first-moment decay beta_1", low=0, high=1, high_open=True),
              Param("beta_2", float, 0.99, "second-moment rate beta_2", low=0, high=1, high_open=True),
              Param("tau", float, 1e-3, "adaptivity tau, added to sqrt(v)", low=0, low_open=True))

    def second_moment(self, v: Tensors, delta_sq: Tensors) -> Tensors:
        rate = 1.0 - float(self.p["beta_2"])
        return {k: v[k] - rate * delta_sq[k] * torch.sign(v[k] - delta_sq[k]) for k in v}
