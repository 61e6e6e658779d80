"""FedDP (Wang, Jin, Stoyanov, Wang, TMI 2023: "Dual personalization in federated medical
image segmentation"), following its public code (github.com/jcwang123/FedDP), read for
understanding; nothing is copied.

* Local query (LQ): the query embeddings of the attention encoder stay on the site; everything
  else is shared and averaged (federated rounds).
* Inconsistency-guided calibration (IGC), the reference's fine-tuning stage after federated
  training (``scripts/train_ft.py:46-93``, ``scripts/trainer_utils.py:24-40``): the sites'
  personalised models at the end of federated training are frozen as "memory" models; each
  site then fine-tunes its whole model on its own data with the segmentation loss plus
  ``calib_weight`` x a BCE term weighted per pixel and class by the spread of the memory
  models' predictions (standard deviation across sites, divided by its maximum). There is no
  aggregation in that stage. Here it is the last ``calib_rounds`` rounds of the run: in the
  last federated round each site also sends its query embeddings, the server hands all
  sites' queries to every site with the global model (as the reference, whose fine-tuning
  reads every site's model), and each site rebuilds the K memory models from them.
  The reference's stage length and loss weight live in a config file absent from its public
  code; ``calib_rounds`` (x ``local_steps`` iterations) and ``calib_weight`` are ours.
* ``igc: per_round`` keeps an older reading instead: in every round, CE weighted per pixel by
  1 + ``igc_weight`` x the total-variation distance between the site's and the global view's
  predictions.

* What leaves a site (``sent``). ``reference_code`` (default): every trainable parameter but the
  personal groups (the encoder queries), as the reference's FedDP step (``scripts/train_fed.py:276-280``
  calls ``update_global_model_for_trans(part='q')``, ``scripts/trainer_utils.py:149-194``: it averages
  every ``named_parameters`` entry and hands all but the ``.q.`` ones back to the sites), 18.97 MiB a
  round on the paper grid's network. ``paper_text``: only the decoder and its head leave the site, the
  reading of FedST's Table IX (6.7 MB a round = the 1,756,420 decoder + head parameters); the whole
  encoder then stays on each site with its queries. Replies, the reply check and the communication
  column all follow ``shared_keys``, so what is counted is what is sent.

FedST's Table IV row 1 ("pure FedDP model as the baseline") is this method on the network
without temporal module, prompt or channel selection.
"""

from __future__ import annotations

import copy
import re

import torch
import torch.nn.functional as F

from fedmedbench.fl.api.arrays import load_arrays, model_arrays, weighted_average
from fedmedbench.fl.api.method import ClientResult, Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import SegMethod, client_weights, tensors
from fedmedbench.fl.tasks.segmentation import train_steps

SITES = "feddp_site_queries"
#: readings of what a site sends each round (method parameter ``sent``)
SENT_READINGS = ("reference_code", "paper_text")
#: the parameters that leave a site under ``paper_text``: the decoder and its head (FedST Table IX)
PAPER_TEXT_SENT = re.compile(r"^decoder\.")


def inconsistency(local_logits: torch.Tensor, global_logits: torch.Tensor) -> torch.Tensor:
    """Per-pixel total-variation distance of the two predicted class distributions (B, H, W)."""
    return 0.5 * (local_logits.softmax(1) - global_logits.softmax(1)).abs().sum(1)


def spread_map(probs: torch.Tensor) -> torch.Tensor:
    """(K, B, C, H, W) predictions of K models -> their std across models, divided by its max."""
    u = probs.std(dim=0)
    return u / u.max() if u.max() > 0 else u


def weighted_bce(probs: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """BCE of class probabilities (B, C, H, W) against one-hot labels, weighted per pixel and class."""
    onehot = F.one_hot(target, probs.shape[1]).permute(0, 3, 1, 2).float()
    p = probs.clamp(1e-5, 1 - 1e-5)
    return (-(onehot * p.log() + (1 - onehot) * (1 - p).log()) * weight).mean()


@register_method("feddp")
class FedDP(SegMethod):
    params = (Param("personal", list, ["enc_q"], "parameter groups kept on the site"),
              Param("igc", str, "finetune", "inter-site guidance as a final fine-tune or every round", choices=("finetune", "per_round")),
              Param("calib_rounds", int, 1, "last rounds given to calibration", low=0),
              Param("calib_weight", float, 1.0, "weight of the calibration loss", low=0),
              Param("igc_weight", float, 1.0, "weight of the guidance loss", low=0),
              Param("sent", str, "reference_code", "what a site sends: every parameter but the personal ones (the "
                    "reference code) or the decoder and head only (FedST Table IX)", choices=SENT_READINGS))
    extra_records = ("queries",)

    def personal(self, model):
        """The queries and every buffer: the reference averages ``named_parameters`` only
        (``scripts/trainer_utils.py:149-166``), so normalisation statistics never leave a site.
        Under ``sent: paper_text`` every parameter outside the decoder and its head stays too."""
        own = super().personal(model)
        params = set(dict(model.named_parameters()))
        if self.p["sent"] == "paper_text":
            params = {k for k in params if PAPER_TEXT_SENT.match(k)}
        return own + [k for k in model.state_dict() if k not in params and k not in own]

    def _first_calib_round(self, ctx) -> int | None:
        return self._calibration_from(ctx.train.rounds)

    def _calibration_from(self, rounds: int) -> int | None:
        """The first calibration round (None: no calibration stage)."""
        n = int(self.p["calib_rounds"])
        if self.p["igc"] != "finetune" or n <= 0:
            return None
        if n >= rounds:
            raise ValueError(f"method_params.feddp.calib_rounds = {n} leaves no federated round of {rounds}")
        return rounds - n + 1

    def reply_keys(self, model, rnd, train):
        """Calibration rounds send nothing; the round before them adds the site's queries (its personal keys)."""
        first = self._calibration_from(train.rounds)
        arrays = [] if first is not None and rnd >= first else self.shared_keys(model)
        return {"arrays": arrays, "queries": self.personal(model)}

    # --- client --------------------------------------------------------------------------
    def client_fit(self, ctx):
        first = self._first_calib_round(ctx)
        if first is not None and ctx.rnd >= first:
            return self._calibrate(ctx)
        if self.p["igc"] == "per_round":
            return self._per_round(ctx)
        model = self.prepare(ctx)
        loss = self.local_train(ctx, model)
        result = self.finish(ctx, model, loss)
        if first is not None and ctx.rnd == first - 1:  # the memory models need every site's queries
            result.extras = {"queries": model_arrays(model, self.personal(model))}
        return result

    def _calibrate(self, ctx) -> ClientResult:
        """Fine-tune the whole personalised model, BCE weighted by the memory models' spread."""
        base = copy.deepcopy(ctx.model).eval()  # the global model at the end of federated training
        model = self.prepare(ctx)  # global + own queries; from the second stage round on: own whole model
        sites = ctx.broadcast.get(SITES, {})
        memory = []
        for pid in sorted({k.split("/", 1)[0] for k in sites}):
            m = copy.deepcopy(base)
            own = {k.split("/", 1)[1]: v for k, v in sites.items() if k.startswith(f"{pid}/")}
            load_arrays(m, own, list(own))
            m.set_indicator(ctx.data.indicator)
            for p in m.parameters():
                p.requires_grad_(False)
            memory.append(m.eval())
        if not memory:
            raise RuntimeError(f"round {ctx.rnd}: FedDP calibration without the sites' query embeddings")
        w = float(self.p["calib_weight"])

        def igc(m, x, y, logits):
            with torch.no_grad():
                u = spread_map(torch.stack([mm.to(x.device)(x).softmax(1) for mm in memory]))
            return w * weighted_bce(logits.softmax(1), y, u)

        loss = train_steps(model, ctx.data.train, ctx.steps, ctx.train, ctx.train.lr_at(ctx.rnd), ctx.device,
                           ctx.generator, self.loss_cfg(ctx), extra_loss=igc)
        keys = [k for k in model.state_dict()]
        ctx.state["personal"] = tensors(model, keys)  # the whole fine-tuned model now stays on the site
        return ClientResult(arrays={}, num_examples=ctx.data.num_train, metrics={"train_loss": loss})

    def _per_round(self, ctx) -> ClientResult:
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

    # --- server --------------------------------------------------------------------------
    def aggregate(self, ctx):
        first = self._first_calib_round(ctx)
        if first is not None and ctx.rnd >= first:
            return ctx.global_arrays  # calibration: no aggregation
        out = weighted_average([r.arrays for r in ctx.results], client_weights(ctx))
        if first is not None and ctx.rnd == first - 1:
            ctx.broadcast[SITES] = {f"{pid}/{k}": v for pid, r in zip(ctx.pids, ctx.results, strict=True)
                                    for k, v in r.extras["queries"].items()}
        return out
