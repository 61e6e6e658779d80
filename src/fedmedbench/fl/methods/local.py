"""Local training: every client trains its own model alone, nothing is aggregated.

Client: round 1 starts from the common initial model; afterwards from its own model
kept in its persistent client state; E local epochs per round; the model never
leaves the client (the reply carries no arrays).
Server: the global model is never updated. Evaluation is per client with the
client's own model (on its local test set and on the global test set; the global
numbers are the mean over clients).
"""

from __future__ import annotations

from fedmedbench.fl.api import ClientContext, ClientResult, Method
from fedmedbench.fl.arrays import arrays_to_tensors, load_arrays, model_arrays
from fedmedbench.fl.registry import register_method
from fedmedbench.fl.training import local_sgd


@register_method("local")
class Local(Method):
    personalized = True

    def _own_model(self, ctx: ClientContext):
        if "model" in ctx.state:
            load_arrays(ctx.model, {k: v.numpy() for k, v in ctx.state["model"].items()})
        return ctx.model

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        model = self._own_model(ctx)
        loss = local_sgd(model, ctx.data.train_x, ctx.data.train_y, ctx.steps, ctx.train, ctx.rnd, ctx.device, ctx.generator)
        ctx.state["model"] = arrays_to_tensors(model_arrays(model))
        return ClientResult(arrays={}, num_examples=ctx.data.num_train, metrics={"train_loss": loss})

    def personal_model(self, ctx: ClientContext):
        return self._own_model(ctx)

    def aggregate(self, ctx):
        return ctx.global_arrays
