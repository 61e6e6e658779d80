"""FedLD (Zeng, Guo, Wang, Wang, Zhou, Qu, MICCAI 2024: "Tackling data heterogeneity in
federated learning via loss decomposition"), implemented from its paper's description.

The paper decomposes the global loss into local, distribution-shift and aggregation
terms and reduces them with (1) a margin-control regulariser in local training and (2) a
principal-gradient-based server aggregation that aggregates client updates along their
principal directions to reduce conflicts. No code of it is used here; where the abstract
level description leaves choices open, these are ours:

* Margin control (client): for every pixel, margin = logit of the true class minus the
  largest other logit; the loss adds ``margin_weight * mean(relu(margin - margin_cap)^2)``
  so a site cannot drive its logits to over-confident, site-specific margins.
* Principal-gradient aggregation (server): the client updates Delta_k = w_k - w_g (all
  floating-point shared entries, flattened) are stacked; their principal directions come
  from the SVD of the weighted, stacked updates; the aggregated update is the weighted
  mean update projected onto the smallest set of leading directions that explains
  ``energy`` of the spectrum (the remaining directions, where clients disagree, are
  dropped). Integer buffers are averaged as in FedAvg.

One global model (no personal parameters), like FedAvg.
"""

from __future__ import annotations

import numpy as np
import torch

from fedmedbench.fl.methods.fedst_base import SegMethod, client_weights, flat, unflat
from fedmedbench.fl.registry import register_method, weighted_average
from fedmedbench.fl.segmentation import train_steps


def margin_penalty(logits: torch.Tensor, target: torch.Tensor, cap: float) -> torch.Tensor:
    true = logits.gather(1, target[:, None])[:, 0]
    other = logits.scatter(1, target[:, None], float("-inf")).amax(dim=1)
    return torch.relu(true - other - cap).pow(2).mean()


def principal_update(deltas: np.ndarray, weights: np.ndarray, energy: float) -> tuple[np.ndarray, int]:
    """Weighted mean of the rows of ``deltas`` (K x P) projected on their leading principal directions."""
    w = weights / weights.sum()
    mean = w @ deltas
    scaled = deltas * np.sqrt(w)[:, None]
    # SVD through the K x K Gram matrix (K clients << P parameters)
    gram = scaled @ scaled.T
    vals, vecs = np.linalg.eigh(gram)
    order = np.argsort(vals)[::-1]
    vals, vecs = np.clip(vals[order], 0, None), vecs[:, order]
    if vals.sum() <= 0:
        return mean, 0
    r = int(np.searchsorted(np.cumsum(vals) / vals.sum(), energy) + 1)
    r = min(r, int((vals > 1e-12 * vals[0]).sum()))
    dirs = (scaled.T @ vecs[:, :r]) / np.sqrt(vals[:r])[None]  # P x r, orthonormal right singular vectors
    return dirs @ (dirs.T @ mean), r


@register_method("fedld")
class FedLD(SegMethod):
    personalized = False
    defaults = {"personal": [], "margin_weight": 0.1, "margin_cap": 5.0, "energy": 0.9}

    def local_train(self, ctx, model):
        w, cap = float(self.p["margin_weight"]), float(self.p["margin_cap"])
        return train_steps(model, ctx.data.train, ctx.steps, ctx.train, ctx.train.lr_at(ctx.rnd), ctx.device,
                           ctx.generator, self.loss_cfg(ctx), extra_loss=lambda m, x, y, logits: w * margin_penalty(logits, y, cap))

    def aggregate(self, ctx):
        base = weighted_average([r.arrays for r in ctx.results], client_weights(ctx))
        keys = [k for k, v in ctx.global_arrays.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
        g = flat(ctx.global_arrays, keys)
        deltas = np.stack([flat(r.arrays, keys) - g for r in ctx.results])
        update, rank = principal_update(deltas, np.asarray(client_weights(ctx)), float(self.p["energy"]))
        ctx.state["principal_rank"] = rank
        base.update(unflat(g + update, ctx.global_arrays, keys))
        return base
