"""FedLD (Zeng et al., MICCAI 2024: "Tackling data heterogeneity in federated learning via
loss decomposition"), following its public code (github.com/Zeng-Shuang/FedLD), read for
understanding; nothing is copied.

Client (margin control, ``methods/fedld.py:9-19`` of the reference): the local loss adds
``margin_weight * log(1 + ||softmax(logits)||^2)`` to the task loss, the norm taken over
the whole batch's softmax output (reference default ``margin_loss_penalty = 0.03``,
``options.py:35``). Here the task loss is the study's CE + lambda1 Dice.

Server (principal-gradient aggregation, ``svd_tools.py:104-166``), per layer (state_dict
entry) with the K client updates g_i = w_i - w_global as rows of G:

1. round 1 of the run (no history yet) and one-element layers: the plain mean of the g_i;
2. otherwise the K x K matrix H = G G^T / K is decomposed (SVD), its eigenvectors e_j give
   directions w_j = G^T e_j, of which the leading k = floor(``k_proportion`` * K) are kept
   (reference 0.8, ``options.py:37``);
3. sign alignment: w_j is flipped when more clients point against it than along it;
4. each client's update becomes sum_j of its projection on w_j rescaled to the norm
   ``s_j / sum(s) * ||g_i||``; the new global update is the plain mean over the clients.

The reference averages uniformly (``torch.mean`` over clients); integer buffers are averaged
as in FedAvg. One global model (no personal parameters), like FedAvg.
"""

from __future__ import annotations

import numpy as np
import torch

from fedmedbench.fl.api.arrays import weighted_average
from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import SegMethod, client_weights
from fedmedbench.fl.tasks.segmentation import train_steps


def margin_loss(logits: torch.Tensor, weight: float) -> torch.Tensor:
    """The reference's margin term: weight * log(1 + ||softmax(logits over classes)||_2^2), whole batch."""
    return weight * torch.log1p(torch.linalg.vector_norm(logits.softmax(dim=1)) ** 2)


def principal_layer_update(g: np.ndarray, k_proportion: float) -> np.ndarray:
    """One layer's aggregated update from the client updates ``g`` (K x P), steps 2-4 above."""
    k_clients = g.shape[0]
    if g.shape[1] == 1:
        return g.mean(0)
    h = g @ g.T / k_clients
    e, s, _ = np.linalg.svd(h)  # H is symmetric PSD: left singular vectors = eigenvectors
    k = int(k_clients * k_proportion)
    w = (g.T @ e[:, :k]).T  # k x P directions
    for j in range(k):  # sign alignment by majority of the clients
        if (g @ w[j] >= 0).sum() < (g @ w[j] < 0).sum():
            w[j] = -w[j]
    total = s.sum()
    out = np.zeros(g.shape[1])
    for i in range(k_clients):
        norm_i = np.linalg.norm(g[i])
        for j in range(k):
            ww = float(w[j] @ w[j])
            if ww <= 0 or total <= 0:
                continue
            proj = (g[i] @ w[j]) / ww * w[j]
            pn = np.linalg.norm(proj)
            if pn > 0:
                out += proj * (s[j] / total) * norm_i / pn
    return out / k_clients


@register_method("fedld")
class FedLD(SegMethod):
    personalized = False
    params = (Param("margin_weight", float, 0.03, "weight of the margin loss", low=0),
              Param("k_proportion", float, 0.8, "share of principal directions kept per layer", low=0, high=1, low_open=True))

    def local_train(self, ctx, model):
        w = float(self.p["margin_weight"])
        return train_steps(model, ctx.data.train, ctx.steps, ctx.train, ctx.train.lr_at(ctx.rnd), ctx.device,
                           ctx.generator, self.loss_cfg(ctx), extra_loss=lambda m, x, y, logits: margin_loss(logits, w))

    def aggregate(self, ctx):
        """Per floating-point layer the principal-gradient update, in NumPy on the host (its SVD and norms as
        the study computed them); integer buffers averaged as FedAvg."""
        out = weighted_average([r.arrays for r in ctx.results], client_weights(ctx))  # integer buffers
        first = "fedld_started" not in ctx.state
        for key, glob in ctx.global_arrays.items():
            if not glob.dtype.is_floating_point:
                continue
            base = glob.detach().cpu().numpy()
            g = np.stack([r.arrays[key].detach().cpu().numpy().astype(np.float64).ravel() - base.ravel()
                          for r in ctx.results])
            upd = g.mean(0) if first else principal_layer_update(g, float(self.p["k_proportion"]))
            out[key] = torch.from_numpy((base.ravel() + upd).reshape(base.shape).astype(base.dtype))
        ctx.state["fedld_started"] = 1
        return out
