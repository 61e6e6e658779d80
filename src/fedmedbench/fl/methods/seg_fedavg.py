"""``seg_fedavg``: FedAvg of the whole segmentation network (the FedST study's baseline)."""

from __future__ import annotations

from fedmedbench.fl.methods._seg_shared import AGGREGATION_CHOICES, SegMethod
from fedmedbench.fl.registry import register_method


@register_method("seg_fedavg")
class SegFedAvg(SegMethod):
    """FedAvg: the whole network is shared and averaged, weighted by the sites' training clips
    (McMahan et al.: n_k / n); ``aggregation: uniform`` averages 1/K; ``null`` follows
    ``train.aggregation``. One global model is evaluated."""

    personalized = False
    defaults = {"personal": [], "aggregation": "examples"}
    choices = {"aggregation": AGGREGATION_CHOICES}
