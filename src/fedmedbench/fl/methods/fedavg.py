"""FedAvg (McMahan et al., 2017).

Client: start from the global model, run E local epochs of SGD on its data, send
the full state (parameters and BatchNorm buffers).
Server: average the client states weighted by their numbers of training examples.
"""

from fedmedbench.fl.registry import Method, register_method


@register_method("fedavg")
class FedAvg(Method):
    """The base ``Method`` already is FedAvg; registered under its name."""
