"""The ``segmentation`` task: surgical clips per site (``export_clips``), part segmentation.

Data: ``task_params.clips_root`` holds ``sites.json`` and ``<site>/clips.parquet`` (one row
per labelled frame: ``clip_paths`` oldest .. current, ``mask_path``, ``split``). Clients
are ``task_params.sites`` in order (partition id = position). A clip is loaded as uint8
(T, 3, H, W) with exactly the frames ``clip_paths`` lists (T = num_previous + 1), its mask
as int64 (H, W).

Evaluation (metrics from :mod:`fedmedbench.metrics.segmentation`): ``local_*`` = a model on one
site's test clips; ``global_*`` = on the test clips of all federated sites together.
Metric names: ``dice``, ``iou``, ``hd95``, ``assd`` (means over the part classes) and
``<metric>_<class>`` per class. Out-of-federation and unseen-binary evaluation of the
deployed model are done after training (``scripts/fedst_train.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from fedmedbench.fl.tasks.base import Task, register_task
from fedmedbench.fl.tasks.segmentation.clips import (
    ClipSet,
    FrameCache,
    SiteData,
    input_size,
    load_clipset,
    load_sites,
)
from fedmedbench.fl.tasks.segmentation.evaluation import evaluate_clips, metric_names, scoring
from fedmedbench.fl.tasks.segmentation.indicators import site_indicators


@register_task("segmentation")
class SegmentationTask(Task):
    """Sites = clients; see the module docstring. ``task_params`` keys:

    ``clips_root``, ``sites`` (federated, in client order), ``model`` (FedSTNet config),
    ``indicator`` (kind, dim, clip_weights, clip_model, sigma), ``loss`` (dice_weight,
    augment, rotate_deg, scale), ``input_size`` ([h, w] every clip is resized to; metrics,
    HD95 and ASSD included, are computed at that size), ``cache_mb`` (bound of the decoded-clip
    cache; ``spec.loader_workers`` threads decode the clips ahead of their use), ``local_steps``
    (exact iterations per round on every site and for the pooled Upperbound; None = the engine's
    epochs-based count), ``cross_site_eval`` (personalised models also on the pooled test set; off =
    ``global_*`` NaN for them), ``eval_batch_size``.
    """

    primary_metric = "dice"

    def __init__(self, spec) -> None:
        super().__init__(spec)
        tp = spec.task_params
        for key in ("clips_root", "sites", "model"):
            if key not in tp:
                raise KeyError(f"segmentation task needs task_params.{key}")
        self.meta = load_sites(tp["clips_root"])
        self.all_sites = self.meta["sites"]
        for s in tp["sites"]:
            if s not in self.all_sites:
                raise KeyError(f"fedst sites: '{s}' is not in {Path(tp['clips_root']) / 'sites.json'} ({sorted(self.all_sites)})")
        first = self.all_sites[tp["sites"][0]]
        self.classes = {i: c for i, c in enumerate(first["classes"]) if i > 0}
        self.metric_names = metric_names(self.classes)
        self.num_frames = len(tp["model"].get("pools", [7, 4, 2, 1]))
        self.indicators = site_indicators(self.all_sites, tp.get("indicator", {}))
        self.size = input_size(tp.get("input_size"))
        self.cache = FrameCache(int(tp.get("cache_mb", 2048)) * 2**20, int(spec.loader_workers), spec.image_cache)
        self._sites: dict[str, SiteData] = {}

    @property
    def num_clients(self) -> int:
        return len(self.spec.task_params["sites"])

    def site(self, name: str) -> SiteData:
        """A site's data (any site of sites.json: federated, out-of-federation or server)."""
        if name not in self._sites:
            root = self.spec.task_params["clips_root"]
            info = self.all_sites[name]
            test_split = None if info.get("role") == "out_of_federation" else "test"
            train = self._real_train(name) if test_split else ClipSet([], [], name, self.size, self.cache)
            if test_split and self.spec.task_params.get("synthetic_mix"):
                train = ClipSet.concat([train, self._synthetic()], f"{train.source} + synthetic")
            self._sites[name] = SiteData(
                site=name, index=list(self.all_sites).index(name), prompt=info["prompt"],
                train=train,
                test=load_clipset(root, name, test_split, self.num_frames, self.size, self.cache), indicator=self.indicators[name],
                loss=dict(self.spec.task_params.get("loss", {})), local_steps=self._local_steps(),
            )
        return self._sites[name]

    def _real_train(self, name: str) -> ClipSet:
        return load_clipset(self.spec.task_params["clips_root"], name, "train", self.num_frames, self.size, self.cache)

    def _synthetic(self) -> ClipSet:
        """``task_params.synthetic_mix``: every clip of that (simulator) site, mixed into each
        site's training set (FedST Fig. 7: "all synthetic samples are fully mixed")."""
        return load_clipset(self.spec.task_params["clips_root"], self.spec.task_params["synthetic_mix"], None,
                            self.num_frames, self.size, self.cache)

    def _local_steps(self) -> int | None:
        v = self.spec.task_params.get("local_steps")
        return None if v is None else int(v)

    def client_sizes(self) -> list[int]:
        return [self.site(s).num_train for s in self.spec.task_params["sites"]]

    def client_data(self, pid: int) -> SiteData:
        return self.site(self.spec.task_params["sites"][pid])

    def pooled_data(self) -> SiteData:
        sites = [self.site(s) for s in self.spec.task_params["sites"]]
        mean_ind = torch.stack([s.indicator for s in sites]).mean(0)
        train = [self._real_train(s.site) for s in sites]  # the synthetic clips once, not once per site
        if self.spec.task_params.get("synthetic_mix"):
            train.append(self._synthetic())
        return SiteData("pooled", -1, "", ClipSet.concat(train, "pooled train"),
                        self.pooled_test(), mean_ind, dict(self.spec.task_params.get("loss", {})), self._local_steps())

    def pooled_test(self) -> ClipSet:
        return ClipSet.concat([self.site(s).test for s in self.spec.task_params["sites"]], "pooled test")

    def _bs(self) -> int:
        return int(self.spec.task_params.get("eval_batch_size", 8))

    @property
    def scoring(self) -> dict[str, str]:
        """How :func:`evaluate_clips` scores: class rule, ASSD definition, resolution, where."""
        return scoring(self.spec.task_params)

    def evaluate_global(self, model, device):
        per_client = []
        for s in self.spec.task_params["sites"]:
            model.set_indicator(self.site(s).indicator)
            per_client.append({f"local_{k}": v for k, v in evaluate_clips(model, self.site(s).test, self.classes, device, self._bs(), **self.scoring).items()})
        # pooled test = frame-weighted mean of the sites' per-frame scores
        n = np.array([len(self.site(s).test) for s in self.spec.task_params["sites"]], dtype=float)
        row = {f"global_{k}": float(np.average([c[f"local_{k}"] for c in per_client], weights=n)) for k in self.metric_names}
        return row, per_client

    def evaluate_client(self, model, data, device):
        model.set_indicator(data.indicator)
        out = {f"local_{k}": v for k, v in evaluate_clips(model, data.test, self.classes, device, self._bs(), **self.scoring).items()}
        if self.spec.task_params.get("cross_site_eval", True):
            out.update({f"global_{k}": v for k, v in evaluate_clips(model, self.pooled_test(), self.classes, device, self._bs(), **self.scoring).items()})
        else:
            out.update({f"global_{k}": math.nan for k in self.metric_names})
        return out
