"""FedWMSAM (Li et al., NeurIPS 2025): weighted momentum + momentum-guided SAM.

Following the authors' public code (FL-Simulator based, the code of the early-stopping
study's group):
Server state: momentum m (a gradient estimate: m = -mean(Delta_i / (K_i lr)) * lr_decay),
SCAFFOLD's control variate c, and an adaptive weight alpha.
Client i (state: c_i): client momentum  m_i = m + (c - c_i) * alpha / (1 - alpha);
each step minimises  alpha * CE(theta) + (1 - alpha) * <theta, m_i>  (weighted
momentum, C2) at a perturbed point theta + e, with e = sign * rho * (t - theta)/||t - theta||
where the target t starts at theta_g and moves by m_i after every step (momentum-
guided perturbation, C1; one backward pass per step). sign = -1 in the public code;
the README's formula has +1 (``perturbation_sign``). c_i is updated as SCAFFOLD
option II and delta_c_i sent.
Server: alpha <- 0.99 alpha + 0.01 clip(mean_i(1 + cos(Delta_i, m)), 0.1, 0.9)
(adaptive schedule, C3, using the momentum before this round's update); c += sum
delta_c_i / N; m from this round's updates; theta_g += eta_g mean(Delta_i).
"""

from __future__ import annotations

import numpy as np
import torch

from fedmedbench.fl.methods._sgd import (
    ServerOptMethod,
    StepHooks,
    arrays_to_vector,
    flat_norm,
    local_loop,
    tensors_to_arrays,
    to_tensors,
    trainable,
)
from fedmedbench.fl.methods.scaffold import control_correction, server_control_update, updated_control
from fedmedbench.fl.registry import ClientContext, ClientResult, ServerContext, model_arrays, register_method


@register_method("fedwmsam")
class FedWMSAM(ServerOptMethod):
    extra_records = ("delta_c",)

    def __init__(self, rho: float = 0.1, alpha: float = 0.1, perturbation_sign: int = -1, **params) -> None:
        super().__init__(**params)
        if rho < 0 or not 0 < alpha < 1 or perturbation_sign not in (-1, 1):
            raise ValueError(f"fedwmsam: need rho >= 0, 0 < alpha < 1, sign in (-1, 1); got {rho}, {alpha}, {perturbation_sign}")
        self.rho, self.alpha0, self.sign = float(rho), float(alpha), int(perturbation_sign)

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        like = trainable(ctx.model)
        alpha = float(ctx.broadcast["alpha"]["alpha"]) if "alpha" in ctx.broadcast else self.alpha0
        m = arrays_to_vector(ctx.broadcast["momentum"]) if "momentum" in ctx.broadcast else {
            n: torch.zeros_like(p, device="cpu") for n, p in like.items()}
        c, c_i, corr = control_correction(ctx)
        m_i = {n: (m[n] + corr[n] * alpha / (1 - alpha)).to(ctx.device) for n in like}
        target = {n: t.to(ctx.device) for n, t in to_tensors(ctx.global_arrays, like).items()}

        def perturb(model, xb, yb):
            d = {n: target[n] - p.detach() for n, p in like.items()}
            return {n: t * (self.sign * self.rho / (flat_norm(d) + 1e-7)) for n, t in d.items()}

        def advance_target():
            for n in target:
                target[n] += m_i[n]

        hooks = StepHooks(perturb=perturb, correction={n: (1 - alpha) * t for n, t in m_i.items()},
                          loss_weight=alpha, after_step=advance_target)
        loss = local_loop(ctx, hooks)
        ctx.state["c_i"], dc = updated_control(ctx, c, c_i)
        return ClientResult(arrays=model_arrays(ctx.model), num_examples=ctx.data.num_train,
                            metrics={"train_loss": loss, "k_lr": ctx.steps * ctx.train.lr_at(ctx.rnd)},
                            extras={"delta_c": tensors_to_arrays(dc)})

    def aggregate(self, ctx: ServerContext):
        keys = self.param_keys(ctx)
        deltas = [{k: r.arrays[k].astype(np.float64) - ctx.global_arrays[k].astype(np.float64) for k in keys}
                  for r in ctx.results]
        alpha = float(ctx.broadcast["alpha"]["alpha"]) if "alpha" in ctx.broadcast else self.alpha0
        if "momentum" in ctx.broadcast:
            m_old = np.concatenate([ctx.broadcast["momentum"][k].ravel() for k in keys]).astype(np.float64)
            sims = [_cos(np.concatenate([d[k].ravel() for k in keys]), m_old) + 1.0 for d in deltas]
        else:
            sims = [1.0]  # cosine with a zero momentum is 0 in the reference code, +1
        alpha = 0.99 * alpha + 0.01 * float(np.clip(np.mean(sims), 0.1, 0.9))
        server_control_update(ctx)
        w = self.weights(ctx)
        k_lr = [float(r.metrics["k_lr"]) for r in ctx.results]
        decay = ctx.train.lr_decay
        ctx.broadcast["momentum"] = {
            k: (-sum(wi * d[k] / kl for wi, d, kl in zip(w, deltas, k_lr, strict=True)) * decay).astype(np.float32)
            for k in keys}
        ctx.broadcast["alpha"] = {"alpha": np.asarray(alpha, dtype=np.float64)}
        return super().aggregate(ctx)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return 0.0 if denom == 0 else float(a @ b / denom)
