"""FedAvg (McMahan et al., 2017).

Client: start from the global model, run E local epochs of SGD, send the full state.
Server: average the client states (by examples, or uniformly as in the FL-Simulator
code: ``train.aggregation``) and apply the global learning rate ``global_lr`` to
the averaged update of the parameters (1.0 = plain averaging).
"""

from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._sgd import ServerOptMethod


@register_method("fedavg")
class FedAvg(ServerOptMethod):
    """Plain local SGD + (weighted) averaging; see ServerOptMethod."""

