"""FedDP (Wang, Jin, Stoyanov, Wang, TMI 2023: "Dual personalization in federated medical
image segmentation"), from its paper's description (no code used).

* Local query (LQ): the query embeddings of the attention encoder are trained privately
  (kept on the site); everything else is shared and averaged.
* Inconsistency-guided calibration (IGC): pixels where the site's model disagrees with the
  global model weigh more in the site's cross-entropy. Our reading of it: the global view is
  the received shared parameters with the common initial query embeddings (the server's
  model: it never sees a site's queries), frozen for the round; per pixel,
  u = 0.5 * ||softmax(local) - softmax(global)||_1 in [0, 1], and the loss adds
  ``igc_weight * mean(u * CE_pixel)`` (i.e. CE weighted by 1 + igc_weight * u). The
  distance and the weighting form are our choices.

FedST's Table IV row 1 ("pure FedDP model as the baseline") is this method on the network
without temporal module, prompt or channel selection.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fedmedbench.fl.methods.fedst_base import SegMethod
from fedmedbench.fl.registry import register_method
from fedmedbench.fl.segmentation import train_steps


def inconsistency(local_logits: torch.Tensor, global_logits: torch.Tensor) -> torch.Tensor:
    """Per-pixel total-variation distance of the two predicted class distributions (B, H, W)."""
    return 0.5 * (local_logits.softmax(1) - global_logits.softmax(1)).abs().sum(1)


@register_method("feddp")
class FedDP(SegMethod):
    defaults = {"personal": ["enc_q"], "igc_weight": 1.0}

    def client_fit(self, ctx):
        global_view = copy.deepcopy(ctx.model).eval()  # broadcast shared + initial queries
        global_view.set_indicator(ctx.data.indicator)
        for p in global_view.parameters():
            p.requires_grad_(False)
        model = self.prepare(ctx)
        beta = float(self.p["igc_weight"])

        def igc(m, x, y, logits):
            with torch.no_grad():
                u = inconsistency(logits.detach(), global_view(x))
            return beta * (u * F.cross_entropy(logits, y, reduction="none")).mean()

        loss = train_steps(model, ctx.data.train, ctx.steps, ctx.train, ctx.train.lr_at(ctx.rnd), ctx.device,
                           ctx.generator, self.loss_cfg(ctx), extra_loss=igc if beta > 0 else None)
        return self.finish(ctx, model, loss)
