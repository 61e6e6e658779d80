"""FedAS (Yang, Huang, Ye, CVPR 2024: "Bridging inconsistency in personalized federated
learning"), adapted to segmentation. Read from the paper and PFLlib's implementation for
understanding; no code is copied.

* Parameter alignment (client, before training): the received global representation is
  aligned to the site's own knowledge: per-class prototypes (mean decoder-input features
  of the pixels of each class, computed with the site's previous model on its training
  clips) are targets, and the global shared parameters take ``align_steps`` SGD steps on
  the MSE between their features of those pixels and the prototypes.
* Client synchronisation (server): clients are weighted by the trace of their Fisher
  information (sum of squared gradients of the NLL over ``fisher_batches`` training
  batches after local training), normalised to sum to one.
* The classifier (``decoder.head``) stays on the site, as in PFLlib's base/head split.
The feature level used for prototypes (the deepest encoder map after temporal module and
channel selection, upsampled to the mask) and the number of alignment steps are ours.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedmedbench.fl.methods.fedst_base import SegMethod
from fedmedbench.fl.registry import load_arrays, register_method, weighted_average


def deep_features(model, x: torch.Tensor) -> torch.Tensor:
    """The decoder's deepest input (B, C, h, w) for clips x: encoder -> RSC -> selection."""
    b, t = x.shape[:2]
    if model.rsc is not None:
        deep = model.features(x.reshape(b * t, *x.shape[2:]))[-1]
        f = model.rsc(deep.reshape(b, t, *deep.shape[1:]))
    else:
        f = model.features(x[:, -1])[-1]
    return model.cs(f) if model.cs is not None else f


def pixel_features(model, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    f = deep_features(model, x)
    lab = F.interpolate(y[:, None].float(), size=f.shape[2:], mode="nearest")[:, 0].long()
    return f.permute(0, 2, 3, 1).reshape(-1, f.shape[1]), lab.reshape(-1)


@register_method("fedas")
class FedAS(SegMethod):
    defaults = {"personal": ["head"], "align_steps": 2, "align_lr": 0.01, "fisher_batches": 2}

    def _prototypes(self, ctx, model) -> dict[int, torch.Tensor]:
        sums: dict[int, torch.Tensor] = {}
        counts: dict[int, int] = {}
        model.eval()
        with torch.no_grad():
            for x, y in ctx.data.train.batches(ctx.train.batch_size):
                f, lab = pixel_features(model, x.to(ctx.device), y.to(ctx.device))
                for c in lab.unique().tolist():
                    sums[c] = sums.get(c, 0) + f[lab == c].sum(0)
                    counts[c] = counts.get(c, 0) + int((lab == c).sum())
        return {c: sums[c] / counts[c] for c in sums}

    def _align(self, ctx, model) -> None:
        """Align the broadcast shared parameters to the prototypes of the site's previous model."""
        if "personal" not in ctx.state or "previous" not in ctx.state:
            return
        previous = self.build_model_like(model)
        load_arrays(previous, {k: v.numpy() for k, v in ctx.state["previous"].items()})
        previous.to(ctx.device).set_indicator(ctx.data.indicator)
        protos = self._prototypes(ctx, previous)
        shared = set(self.shared_keys(model))
        params = [p for n, p in model.named_parameters() if n in shared]
        opt = torch.optim.SGD(params, lr=float(self.p["align_lr"]))
        model.train()
        for i in range(int(self.p["align_steps"])):
            x, y = ctx.data.train.batch([i % len(ctx.data.train)])
            f, lab = pixel_features(model, x.to(ctx.device), y.to(ctx.device))
            losses = [F.mse_loss(f[lab == c], protos[c].expand_as(f[lab == c])) for c in lab.unique().tolist() if c in protos]
            if not losses:
                continue
            opt.zero_grad(set_to_none=True)
            torch.stack(losses).mean().backward()
            opt.step()

    @staticmethod
    def build_model_like(model):
        import copy

        return copy.deepcopy(model)

    def _fisher_trace(self, ctx, model) -> float:
        model.eval()
        total = 0.0
        params = [p for p in model.parameters() if p.requires_grad]
        for i, (x, y) in enumerate(ctx.data.train.batches(ctx.train.batch_size)):
            if i >= int(self.p["fisher_batches"]):
                break
            logits = model(x.to(ctx.device))
            nll = F.cross_entropy(logits, y.to(ctx.device))
            grads = torch.autograd.grad(nll, params, allow_unused=True)
            total += float(sum((g.detach() ** 2).sum() for g in grads if g is not None))
        return total

    def client_fit(self, ctx):
        model = self.prepare(ctx)
        self._align(ctx, model)
        loss = self.local_train(ctx, model)
        fisher = self._fisher_trace(ctx, model)
        ctx.state["previous"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return self.finish(ctx, model, loss, {"fisher_trace": fisher})

    def aggregate(self, ctx):
        fim = np.array([r.metrics.get("fisher_trace", 0.0) for r in ctx.results], dtype=float)
        if not np.isfinite(fim).all() or fim.sum() <= 0:
            raise RuntimeError(f"round {ctx.rnd}: FedAS needs positive Fisher traces from every client, got {fim.tolist()}")
        return weighted_average([r.arrays for r in ctx.results], list(fim / fim.sum()))


