"""FedBN (Li et al., ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization").

Client i: the broadcast model with its own batch norm (each BatchNorm layer's weight, bias, running mean and
variance and counter, kept in its client state; the initial model's before its first round), E local epochs
of SGD as FedAvg; it keeps its batch norm and sends the rest.
Server: FedAvg of the rest (weights ``train.aggregation``); it never holds a batch-norm entry.
Evaluation: each client's own model (the global rest + its batch norm) on its local test split and on the
global test set (global numbers: the mean over the clients), as the authors' code tests client i's model on
site i. Batch-norm entries are those of every BatchNorm module; the authors' code (federated/fed_digits.py,
``communication``) skips the state keys whose name holds ``bn``, which are those modules in its networks.
"""

from __future__ import annotations

from torch import nn

from fedmedbench.fl.api.arrays import load_arrays
from fedmedbench.fl.api.method import Arrays, ClientContext, ClientResult
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._sgd import LocalSGDMethod, StepHooks


def batch_norm_keys(model: nn.Module) -> list[str]:
    """The state keys of the model's BatchNorm layers (parameters and buffers)."""
    return [f"{name}.{key}" if name else key for name, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm) for key in module.state_dict()]


@register_method("fedbn")
class FedBN(LocalSGDMethod):
    personalized = True

    def shared_keys(self, model: nn.Module) -> list[str]:
        local = set(batch_norm_keys(model))
        return [k for k in model.state_dict() if k not in local]

    def own_model(self, ctx: ClientContext) -> nn.Module:
        """``ctx.model`` (the broadcast rest) with this client's batch norm."""
        if "bn" in ctx.state:
            load_arrays(ctx.model, ctx.state["bn"], list(ctx.state["bn"]))
        return ctx.model

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        self.own_model(ctx)
        return super().client_fit(ctx)

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics: dict[str, float], arrays: Arrays) -> ClientResult:
        local = set(batch_norm_keys(ctx.model))
        ctx.state["bn"] = {k: v for k, v in arrays.items() if k in local}
        return ClientResult(arrays={k: v for k, v in arrays.items() if k not in local}, num_examples=ctx.data.num_train,
                            metrics=metrics)

    def personal_model(self, ctx: ClientContext) -> nn.Module:
        return self.own_model(ctx)
