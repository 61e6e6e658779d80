"""``seg_centralized`` (the FedST study's Upperbound): one model on the pooled clips of all sites."""

from __future__ import annotations

import torch

from fedmedbench.fl.api.method import ClientContext, Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import SegMethod


@register_method("seg_centralized")
class SegCentralized(SegMethod):
    """Upperbound: one model on the pooled training clips of all sites. ``steps: per_site``
    (default): ``local_steps`` per round, the schedule of each site's model (the paper: "identical
    training schedules"); ``sum_of_sites``: ``local_steps`` x the number of sites per round, the
    federation's total compute (Table IX's ~32 h against FedAvg's ~8.3 h points that way). With
    ``local_steps`` null the engine's pooled epoch is the sites' sum under either reading."""

    personalized = False
    centralized = True
    communicates = False
    params = (Param("steps", str, "per_site", "iterations per round: local_steps (per_site) or local_steps x the sites",
                    choices=("per_site", "sum_of_sites")),)

    def prepare(self, ctx: ClientContext) -> torch.nn.Module:
        model = super().prepare(ctx)
        if self.p["steps"] == "sum_of_sites" and getattr(ctx.data, "local_steps", None):
            if ctx.client_sizes is None:
                raise RuntimeError("seg_centralized steps: sum_of_sites needs the number of sites (client_sizes)")
            ctx.steps = int(ctx.data.local_steps) * len(ctx.client_sizes())
        return model
