"""Local training: every client trains its own model alone, nothing is aggregated.

Client: round 1 starts from the common initial model; afterwards from its own model
kept in its persistent client state; E local epochs per round; the model never
leaves the client (the reply carries no arrays).
Server: the global model is never updated. Evaluation is per client with the
client's own model (on its local test set and on the global test set; the global
numbers are the mean over clients).
"""

from __future__ import annotations

from fedmedbench.fl.api.arrays import host_copies, load_arrays, model_arrays
from fedmedbench.fl.api.method import ClientContext, ClientResult, Method
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.augment import batch_reader
from fedmedbench.fl.training import local_sgd


@register_method("local")
class Local(Method):
    personalized = True

    def _own_model(self, ctx: ClientContext):
        if "model" in ctx.state:
            load_arrays(ctx.model, ctx.state["model"])
        return ctx.model

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        model = self._own_model(ctx)
        loss = local_sgd(model, ctx.data.train_x, ctx.data.train_y, ctx.steps, ctx.train, ctx.rnd, ctx.device, ctx.generator,
                         images=batch_reader(ctx))
        ctx.state["model"] = host_copies(model_arrays(model))
        return ClientResult(arrays={}, num_examples=ctx.data.num_train, metrics={"train_loss": loss})

    def reply_keys(self, model, rnd, train):
        return {"arrays": []}  # the model never leaves the client

    def personal_model(self, ctx: ClientContext):
        return self._own_model(ctx)

    def aggregate(self, ctx):
        return ctx.global_arrays
