"""Centralized baseline: one model trained on the pooled training data of all clients.

The engine runs it as a single client holding every client's training data, for
the same number of rounds and the same number of optimisation steps per round as
the federated methods take on average (sampled fraction x local epochs x batches
of every client), so comparisons are at equal compute.
"""

from fedmedbench.fl.api.method import Method
from fedmedbench.fl.api.registry import register_method


@register_method("centralized")
class Centralized(Method):
    centralized = True
    #: batches are indexed wherever the pooled data is (the engine may keep it on the device)
    device_data = True
