"""``seg_local`` (the FedST study's Local Train): each site trains the whole model alone."""

from __future__ import annotations

from fedmedbench.fl.api.method import ClientResult, Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import ALWAYS_PERSONAL, SegMethod, tensors


@register_method("seg_local")
class SegLocal(SegMethod):
    """Local Train: each site trains the whole model alone; nothing leaves a site."""

    communicates = False
    params = (Param("personal", list, ["all"], "parameter groups kept on the site"),)

    def shared_keys(self, model):  # the common initial model is broadcast once; never updated
        return [k for k in model.state_dict() if not ALWAYS_PERSONAL.match(k)]

    def reply_keys(self, model, rnd, train):
        return {"arrays": []}  # nothing leaves a site

    def client_fit(self, ctx):
        model = self.prepare(ctx)
        loss = self.local_train(ctx, model)
        ctx.state["personal"] = tensors(model, self.personal(model))
        return ClientResult(arrays={}, num_examples=ctx.data.num_train, metrics={"train_loss": loss})

    def aggregate(self, ctx):
        return ctx.global_arrays
