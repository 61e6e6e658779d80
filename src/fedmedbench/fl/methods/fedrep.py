"""FedRep (Collins et al., ICML 2021) for the FedST study: shared representation, personal head.

As FedST's paper describes it for segmentation, the head is the whole decoder: it stays on
its site; the encoder (and temporal module, if configured) is shared and averaged. Client
round, as the reference code (github.com/lgcollins/FedRep, ``models/Update.py:593-615``):
first ``head_eps = local_ep - local_rep_ep`` epochs train only the head with the
representation frozen, then ``local_rep_ep`` epochs train the representation with the head
frozen. The reference defaults are local_ep = 5, local_rep_ep = 1 (``utils/options.py:14,39``),
so the head gets 4/5 of the round: ``head_fraction`` = 0.8 of the round's iterations here
(the FedST study counts iterations, not epochs).

Server: the reference weights each site's model by its number of training samples
(``main_fedrep.py:43-45,162-182``; equal shards on CIFAR make that uniform there, unequal
sites do not), so ``aggregation: examples`` is the default whatever ``train.aggregation``
says; ``uniform`` averages 1/K, ``null`` follows ``train.aggregation``.
"""

from __future__ import annotations

from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import AGGREGATION_CHOICES, SegMethod
from fedmedbench.fl.tasks.segmentation import train_steps


@register_method("fedrep")
class FedRep(SegMethod):
    params = (Param("personal", list, ["decoder"], "parameter groups kept on the site (the head)"),
              Param("head_fraction", float, 0.8, "share of a round's iterations that train the head", low=0, high=1),
              Param("aggregation", str, "examples", "site weights: training clips, uniform 1/K, or null = train.aggregation", choices=AGGREGATION_CHOICES))

    def local_train(self, ctx, model):
        head = set(self.personal(model))
        named = dict(model.named_parameters())
        head_params = [p for n, p in named.items() if n in head]
        body_params = [p for n, p in named.items() if n not in head]
        head_steps = max(1, int(round(ctx.steps * float(self.p["head_fraction"]))))
        lr = ctx.train.lr_at(ctx.rnd)
        common = (ctx.train, lr, ctx.device, ctx.generator, self.loss_cfg(ctx))
        loss_h = train_steps(model, ctx.data.train, head_steps, *common, params=head_params)
        body_steps = max(0, ctx.steps - head_steps)
        if body_steps == 0:
            return loss_h
        loss_b = train_steps(model, ctx.data.train, body_steps, *common, params=body_params)
        return (loss_h * head_steps + loss_b * body_steps) / ctx.steps
