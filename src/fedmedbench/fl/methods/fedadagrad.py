"""FedAdagrad (Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Algorithm 2), as Flower's FedAdagrad.

Client: E local epochs of SGD from the global model, as FedAvg (Flower's eta_l is ``train.lr``).
Server (round t; m_0 = v_0 = 0; ``_fedopt.py``): the squared updates summed over the rounds scale the step:
    Delta_t = sum_i p_i theta_i - theta
    m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t       (beta_1 = 0: m_t = Delta_t)
    v_t = v_{t-1} + Delta_t^2
    theta <- theta + eta m_t / (sqrt(v_t) + tau)
Flower fixes beta_1 = 0 (flwr 1.41 server/strategy/fedadagrad.py:122; its step 154-170); the paper's
Algorithm 2 keeps a momentum beta_1 for all three, here ``beta_1 > 0``. Defaults: Flower's (fedadagrad.py:103-105).
"""

from __future__ import annotations

from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._fedopt import FedOpt
from fedmedbench.fl.methods._sgd import Tensors, add


@register_method("fedadagrad")
class FedAdagrad(FedOpt):
    params = (Param("eta", float, 0.1, "server learning rate eta", low=0, low_open=True),
              Param("beta_1", float, 0.0, "first-moment decay beta_1 (0: Flower's; the paper's momentum > 0)",
                    low=0, high=1, high_open=True),
              Param("tau", float, 1e-9, "adaptivity tau, added to sqrt(v)", low=0, low_open=True))

    def second_moment(self, v: Tensors, delta_sq: Tensors) -> Tensors:
        return add(v, delta_sq)
