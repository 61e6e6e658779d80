"""``seg_fedavg``: FedAvg of the whole segmentation network (the FedST study's baseline)."""

from __future__ import annotations

from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import AGGREGATION_CHOICES, SegMethod


@register_method("seg_fedavg")
class SegFedAvg(SegMethod):
    """FedAvg: the whole network is shared and averaged, weighted by the sites' training clips
    (McMahan et al.: n_k / n); ``aggregation: uniform`` averages 1/K; ``null`` follows
    ``train.aggregation``. One global model is evaluated."""

    personalized = False
    params = (Param("aggregation", str, "examples", "site weights: training clips, uniform 1/K, or null = train.aggregation", choices=AGGREGATION_CHOICES),)
