"""FedAS (Yang, Huang, Ye, CVPR 2024: "Bridging inconsistency in personalized federated
learning"), adapted to segmentation, following its public code (github.com/xiyuanyang45/FedAS),
read for understanding; nothing is copied.

* Parameter alignment (client, before training; ``system/flcore/clients/clientas.py:171-231``,
  ``set_parameters``): per-class prototypes = mean representation of each class, computed
  with the site's own previous model over all its training data; the received shared
  parameters then take one full epoch (``align_epochs``) of SGD (lr ``align_lr`` = 0.01, as
  the reference) on the MSE between their representation of each class and its prototype,
  batch by batch over the training clips; the aligned shared part replaces the site's.
  Both passes use batches of ``align_batch_size`` = 16 clips (the reference's fixed loader,
  ``clientas.py:181``). It runs from the first round on: there the site's previous model is
  its initial model, the same as the broadcast one (the reference's clients and server start
  from one model and align in round 0 too). Both passes run the network in eval mode
  (``align_mode: eval``): normalisation layers use their running statistics and leave them
  unchanged, as the reference: its client models are left in eval mode by the Fisher pass
  (``clientas.py:94,124``) and its server model is a copy of one of them (``serveras.py:47``;
  only its first alignment takes the fresh initial model, in train mode, which its CNN without
  normalisation or dropout does not notice). ``align_mode: train`` runs the alignment pass in
  train mode instead (batch statistics, running statistics updated); prototypes stay in eval.
* Client synchronisation (server; ``system/flcore/servers/serveras.py:44-59``,
  ``aggregate_wrt_fisher``): every client sends the trace of its Fisher information, the sum
  over *all* its training batches (``clientas.py:93-114``, after local training) of the
  squared gradients of the batch-mean NLL; the server weights the models by trace / sum of
  traces. Normalisation buffers (running statistics) are averaged with the same weights
  (ours: the reference averages ``parameters()`` only, so buffers would stay those of the first
  uploaded model, ``serveras.py:47-49``; its CNN has none).
* Evaluation (``evaluate: trained``): each site's own model as its last local training left it
  (``ctx.state["previous"]``). The reference evaluates at the start of each round, before it
  sends the new global model (``serveras.py:73-79``), and each client tests its ``self.model``
  (``clientbase.py:82-100``): the model it trained in the round before, neither the Fisher
  average nor its alignment. ``evaluate: aggregate`` evaluates the new Fisher-averaged shared
  part with the site's own classifier instead (no alignment, no local training). A site not yet
  trained is evaluated that way under either reading.
* The classifier (``decoder.head``) stays on the site (the reference's base/head split:
  ``set_parameters`` replaces only ``model.base``).

Adaptation to segmentation (ours): the representation is what the reference's ``base``
returns, the classifier's input (``representation: head_input``: the decoder's fused map at a
quarter of the input size), so alignment reaches every shared layer; a "sample" of a class is a
pixel of that map (labels resized by nearest neighbour). ``representation: deep`` takes the
decoder's deepest input instead (encoder -> temporal module -> channel selection), which leaves
the decoder's shared layers out of the alignment.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedmedbench.fl.api.arrays import load_arrays, weighted_average
from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import SegMethod
from fedmedbench.fl.training import on_device


def pixel_features(model, x: torch.Tensor, y: torch.Tensor, where: str = "head_input") -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels, C) representation and (pixels,) labels of clips x: ``where`` = head_input (the
    classifier's input) | deep (the decoder's deepest input: encoder -> RSC -> selection)."""
    f = model.head_input(x) if where == "head_input" else model.decoder_inputs(x)[-1]
    lab = F.interpolate(y[:, None].float(), size=f.shape[2:], mode="nearest")[:, 0].long()
    return f.permute(0, 2, 3, 1).reshape(-1, f.shape[1]), lab.reshape(-1)


@register_method("fedas")
class FedAS(SegMethod):
    params = (Param("personal", list, ["head"], "parameter groups kept on the site"),
              Param("align_epochs", int, 1, "epochs of the parameter alignment", low=1),
              Param("align_lr", float, 0.01, "SGD step size of the alignment", low=0, low_open=True),
              Param("align_batch_size", int, 16, "batch of the prototype and alignment passes", low=1),
              Param("representation", str, "head_input", "aligned map: the classifier's input or the encoder's deepest",
                    choices=("head_input", "deep")),
              Param("align_mode", str, "eval", "network mode of the alignment pass", choices=("eval", "train")),
              Param("fisher_batches", int, None, "cap on the training batches of the Fisher trace (null: all)", low=1,
                    nullable=True),
              Param("evaluate", str, "trained", "a site's own trained model, or the Fisher-averaged one",
                    choices=("trained", "aggregate")))

    def _prototypes(self, ctx, model) -> dict[int, torch.Tensor]:
        sums: dict[int, torch.Tensor] = {}
        counts: dict[int, int] = {}
        model.eval()
        with torch.no_grad():
            for x, y in ctx.data.train.batches(int(self.p["align_batch_size"])):
                f, lab = pixel_features(model, x.to(ctx.device), y.to(ctx.device), self.p["representation"])
                for c in lab.unique().tolist():
                    sums[c] = sums.get(c, 0) + f[lab == c].sum(0)
                    counts[c] = counts.get(c, 0) + int((lab == c).sum())
        return {c: sums[c] / counts[c] for c in sums}

    def _align(self, ctx, model) -> None:
        """Align the broadcast shared parameters to the prototypes of the site's previous model
        (in the first round: the site's initial model, which the broadcast one equals)."""
        previous = self.build_model_like(model)
        if "previous" in ctx.state:
            load_arrays(previous, ctx.state["previous"])
        previous.to(ctx.device).set_indicator(ctx.data.indicator)
        protos = self._prototypes(ctx, previous)
        shared = set(self.shared_keys(model))
        params = [p for n, p in model.named_parameters() if n in shared]
        opt = torch.optim.SGD(params, lr=float(self.p["align_lr"]))
        model.train(self.p["align_mode"] == "train")  # eval: running statistics, left unchanged
        for _ in range(int(self.p["align_epochs"])):  # the reference: one pass over the training data
            for x, y in ctx.data.train.batches(int(self.p["align_batch_size"])):
                f, lab = pixel_features(model, x.to(ctx.device), y.to(ctx.device), self.p["representation"])
                losses = [F.mse_loss(f[lab == c], protos[c].expand_as(f[lab == c])) for c in lab.unique().tolist() if c in protos]
                if not losses:
                    continue
                opt.zero_grad(set_to_none=True)
                torch.stack(losses).sum().backward()  # the reference sums the per-class MSEs
                opt.step()

    @staticmethod
    def build_model_like(model):
        import copy

        return copy.deepcopy(model)

    def _fisher_trace(self, ctx, model) -> float:
        """Trace of the Fisher information over the site's training data (sum of squared NLL gradients).

        Each batch's float32 sum is added in float64 on the device and read once at the end (the same
        additions as a Python float sum of the batches, without the host waiting for every batch)."""
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        params = [p for p in model.parameters() if p.requires_grad]
        limit = self.p["fisher_batches"]  # None: every training batch, as the reference
        for i, (x, y) in enumerate(ctx.data.train.batches(ctx.train.batch_size)):
            if limit is not None and i >= int(limit):
                break
            logits = model(on_device(x, ctx.device))
            nll = F.cross_entropy(logits, on_device(y, ctx.device))
            grads = torch.autograd.grad(nll, params, allow_unused=True)
            squares = [(g.detach() ** 2).sum() for g in grads if g is not None]
            if squares:
                total += sum(squares).double()
        return float(total)

    def client_fit(self, ctx):
        model = self.prepare(ctx)
        self._align(ctx, model)
        loss = self.local_train(ctx, model)
        fisher = self._fisher_trace(ctx, model)
        ctx.state["previous"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return self.finish(ctx, model, loss, {"fisher_trace": fisher})

    def personal_model(self, ctx):
        """The site's locally trained model (the reference tests each client's own model), or with
        ``evaluate: aggregate`` the broadcast shared part + the site's classifier."""
        model = self.prepare(ctx)
        if self.p["evaluate"] == "trained" and "previous" in ctx.state:
            load_arrays(model, ctx.state["previous"])
        return model

    def aggregate(self, ctx):
        fim = np.array([r.metrics.get("fisher_trace", 0.0) for r in ctx.results], dtype=float)
        if not np.isfinite(fim).all() or fim.sum() <= 0:
            raise RuntimeError(f"round {ctx.rnd}: FedAS needs positive Fisher traces from every client, got {fim.tolist()}")
        return weighted_average([r.arrays for r in ctx.results], list(fim / fim.sum()))


