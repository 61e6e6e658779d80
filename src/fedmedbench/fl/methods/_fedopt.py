"""The server step of the adaptive federated optimizers (Reddi et al., ICLR 2021, "Adaptive Federated
Optimization", Algorithm 2), shared by FedAdam, FedYogi and FedAdagrad; each names its second moment.

Round t, after the clients' local SGD (as FedAvg's, at the client lr eta_l = ``train.lr``):

    Delta_t = sum_i p_i theta_i - theta          (p_i: FedAvg's weights, ``train.aggregation``)
    m_t     = beta_1 m_{t-1} + (1 - beta_1) Delta_t
    v_t     = the method's update of v_{t-1} by Delta_t^2
    theta  <- theta + eta_t m_t / (sqrt(v_t) + tau)

As Flower's strategies (flwr 1.41 ``server/strategy/fedadam.py``, ``fedyogi.py``, ``fedadagrad.py``): m and v
start at zero (the paper: v_{-1} >= tau^2) and the step is eta_t = eta, except FedAdam's bias correction.
Flower steps every array the clients send; here the step acts on the trainable parameters and the buffers
(BatchNorm statistics, counters) are averaged, as the rest of the family's servers do. m and v are kept in
float64 in the server state (checkpointed), where the arrays are.
"""

from __future__ import annotations

import torch

from fedmedbench.fl.api.method import Arrays, ServerContext
from fedmedbench.fl.methods._sgd import LocalSGDMethod, Tensors, add, cast_like, div, mul, sub, vectors64


class FedOpt(LocalSGDMethod):
    """The clients of FedAvg; the server's adaptive step above (a subclass gives ``second_moment``)."""

    def second_moment(self, v: Tensors, delta_sq: Tensors) -> Tensors:
        """v_t from v_{t-1} and Delta_t^2."""
        raise NotImplementedError

    def step_size(self, rnd: int) -> float:
        """eta_t of round ``rnd`` (1, 2, ...): eta."""
        return float(self.p["eta"])

    def aggregate(self, ctx: ServerContext) -> Arrays:
        keys = self.param_keys(ctx)
        out = dict(self.average(ctx))  # buffers: FedAvg's average
        theta = vectors64(ctx.global_arrays, keys)
        delta = sub(vectors64(out, keys), theta)
        m, v = (moment(ctx.state, name, theta) for name in ("m", "v"))
        beta_1 = float(self.p["beta_1"])
        m = add(mul(m, beta_1), mul(delta, 1.0 - beta_1))
        v = self.second_moment(v, mul(delta, delta))
        ctx.state["m"], ctx.state["v"] = m, v
        root = dict(zip(v, torch._foreach_sqrt(list(v.values())), strict=True))
        step = div(mul(m, self.step_size(ctx.rnd)), add(root, float(self.p["tau"])))
        out.update(cast_like(add(theta, step), out))
        return out


def moment(state: dict, name: str, like: Tensors) -> Tensors:
    """The server's moment ``name`` (zeros before the first round), float64 where ``like`` is (a resumed run
    reads it back on the CPU)."""
    stored = state.get(name)
    if stored is None:
        return {k: torch.zeros_like(t) for k, t in like.items()}
    return {k: stored[k].to(t.device, torch.float64) for k, t in like.items()}
