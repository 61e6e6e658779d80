"""UltraFlwr (Li et al.): federated Ultralytics YOLO with full or partial aggregation (YOLO-PA).

Client (each round): load the broadcast components into its model, keep its own
weights for every other component (persistent client state, restored on resume),
train E local epochs with Ultralytics, select the local model of the best epoch by
Ultralytics 8.3 fitness (UltraFlwr's ``best.pt``, the default) or by validation mAP50 (the
paper's text), or the last epoch, send only the arrays of the aggregated components, in fp32.
Server: FedAvg with equal client weights (UltraFlwr's clients all report 10 examples; the
default) or weighted by the clients' training image counts (McMahan et al.), or
coordinate-wise FedMedian over the received components. The final aggregation after the last round is
omitted (``final_aggregation``): each client is then evaluated with its own last model.
Communication: bytes each client sent per round, from the arrays actually sent.
Start: the server's model (start weights loaded); with ``head_init: client`` (UltraFlwr's code, the
default) the tensors the start weights do not supply (the class branches for another class count)
restart under each client's own seed in its first training, so FedAvg and the head strategies average
differently initialised heads after round 1; ``common`` keeps the server's one init on every client.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedmedbench.fl.api.arrays import load_arrays, moved, weighted_average
from fedmedbench.fl.api.method import Arrays, ClientContext, ClientResult, Method, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.tasks.detection.ap import AP_RULES
from fedmedbench.fl.tasks.detection.components import SPLITS, aggregated_keys, parse_strategy
from fedmedbench.fl.tasks.detection.matching import MATCH_RULES
from fedmedbench.fl.tasks.detection.pipeline import PIPELINES
from fedmedbench.fl.tasks.detection.yolo import (
    ASSIGNERS,
    AUTO_OPTIMIZERS,
    HEAD_INITS,
    HSV_RULES,
    SELECT,
    SELECT_METRICS,
    WARMUPS,
)

FINAL_AGGREGATION = ("skip_all", "skip_partial", "keep")
WEIGHTING = ("frames", "uniform")


def fedavg_weights(num_examples: list[int], weighting: str) -> list[float]:
    """FedAvg weights: each client's training frames (McMahan et al.) or 1 each (UltraFlwr's clients)."""
    if weighting == "frames":
        return [float(n) for n in num_examples]
    if weighting == "uniform":
        return [1.0] * len(num_examples)
    raise ValueError(f"weighting must be one of {WEIGHTING}, got '{weighting}'")


def median_arrays(arrays: list[Arrays]) -> Arrays:
    """Coordinate-wise median per key (Flower's FedMedian: NumPy's median, on the host), cast back to each
    key's dtype."""
    if not arrays:
        raise ValueError("nothing to aggregate: no client results")
    out = {}
    for k in arrays[0]:
        stacked = np.stack([a[k].detach().cpu().numpy() for a in arrays])
        out[k] = torch.from_numpy(np.asarray(np.median(stacked, axis=0)).astype(stacked.dtype))
    return out


def bytes_of(arrays: Arrays) -> int:
    return int(sum(a.numel() * a.element_size() for a in arrays.values()))


@register_method("ultraflwr")
class UltraFlwr(Method):
    personalized = True  # partial strategies leave each client its own model; all are evaluated per client

    task = "detection"
    params = (
        Param("strategy", str, "FedAvg", "FedAvg, or a partial strategy such as FedBackbone / FedNeckHead"),
        Param("split", str, "ultraflwr", "backbone/neck/head key map", choices=SPLITS),
        Param("select", str, "best", "the client checkpoint sent: best or last epoch", choices=SELECT),
        Param("select_metric", str, "fitness", "what 'best' maximises", choices=SELECT_METRICS),
        Param("weighting", str, "uniform", "FedAvg weights: training frames or 1 each", choices=WEIGHTING),
        Param("final_aggregation", str, "skip_all", "whether the last round is aggregated", choices=FINAL_AGGREGATION),
        Param("ultralytics", dict, None, "extra Ultralytics training arguments", nullable=True),
        Param("auto_optimizer", str, "ultralytics_8_3", "optimizer choice of 'auto'", choices=AUTO_OPTIMIZERS),
        Param("head_init", str, "client", "detection head of the clients' first round", choices=HEAD_INITS),
        Param("workers", int, 0, "data-loader workers (speed only)", low=0),
        Param("warmup", str, "ultralytics_8_3", "warm-up schedule", choices=WARMUPS),
        Param("assigner", str, "ultralytics_8_3", "target assigner", choices=ASSIGNERS),
        Param("hsv", str, "ultralytics_8_3", "HSV augmentation rule", choices=HSV_RULES),
        Param("ap", str, "ultralytics_8_3", "how Ultralytics' AP is computed", choices=AP_RULES),
        Param("match", str, "ultralytics_8_3", "how detections are matched to boxes", choices=MATCH_RULES),
        Param("pipeline", str, "ultralytics_8_3", "how the training samples are drawn", choices=PIPELINES),
    )

    def __init__(self, **params) -> None:
        super().__init__(**params)
        p = self.p
        self.components, self.aggregator = parse_strategy(p["strategy"])
        self.strategy = p["strategy"]
        self.split, self.select, self.select_metric = p["split"], p["select"], p["select_metric"]
        self.weighting, self.final_aggregation = p["weighting"], p["final_aggregation"]
        # where Ultralytics 8.4 (installed) trains differently from UltraFlwr's 8.3.48 (yolo.py's module docstring)
        self.auto_optimizer, self.warmup, self.assigner, self.hsv = p["auto_optimizer"], p["warmup"], p["assigner"], p["hsv"]
        self.ap, self.match, self.pipeline = p["ap"], p["match"], p["pipeline"]
        self.head_init = p["head_init"]
        self.ultralytics = dict(p["ultralytics"] or {})
        self.workers = int(p["workers"])

    @property
    def partial(self) -> bool:
        return len(self.components) < 3

    def skips_final(self) -> bool:
        return self.final_aggregation == "skip_all" or (self.final_aggregation == "skip_partial" and self.partial)

    # --- model -------------------------------------------------------------------
    def build_model(self, spec):
        from fedmedbench.fl.tasks.detection.yolo import build_yolo

        return build_yolo(spec.model, int(spec.num_classes), seed=spec.seed, weights=spec.pretrained_path)

    def shared_keys(self, model) -> list[str]:
        return aggregated_keys(model, self.components, self.split)

    def reply_keys(self, model, rnd, train):
        """The aggregated components' arrays; nothing after the last round when its aggregation is omitted."""
        return {"arrays": [] if (rnd >= train.rounds and self.skips_final()) else self.shared_keys(model)}

    # --- client ------------------------------------------------------------------
    def _restore_own(self, ctx: ClientContext, everything: bool) -> None:
        """Load the client's own weights: the non-aggregated components (or all of them)."""
        own = ctx.state.get("model")
        if not own:
            return  # first training: the server's model
        shared = set(self.shared_keys(ctx.model))
        keys = list(own) if everything else [k for k in own if k not in shared]
        load_arrays(ctx.model, {k: own[k] for k in keys}, keys)

    def _own_head_init(self, ctx: ClientContext) -> list[str]:
        """A client's first training with ``head_init: client``: the tensors the start weights did not supply
        restart under the client's own seed, as UltraFlwr's client trainer rebuilds the model under ``seed=cid``
        before loading what it received; after round 1 the shared components carry aggregated values (kept)."""
        from fedmedbench.fl.tasks.detection.yolo import reinit_unsupplied

        if self.head_init != "client" or ctx.state.get("model"):
            return []
        return reinit_unsupplied(ctx.model, ctx.data.seed, keep=self.shared_keys(ctx.model) if ctx.rnd > 1 else ())

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        from fedmedbench.fl.tasks.detection.yolo import train_yolo

        data = ctx.data
        self._restore_own(ctx, everything=False)
        self._own_head_init(ctx)
        outcome = train_yolo(ctx.model, data.data_yaml, epochs=int(round(ctx.train.local_epochs)),
                             batch=ctx.train.batch_size, imgsz=data.imgsz, seed=data.seed, device=ctx.device,
                             workdir=f"{data.workdir}/r{ctx.rnd:03d}", select=self.select,
                             select_metric=self.select_metric, extra=self.ultralytics,
                             auto_optimizer=self.auto_optimizer, workers=self.workers, warmup=self.warmup,
                             assigner=self.assigner, hsv=self.hsv, read_ahead=data.read_ahead, ap=self.ap,
                             pixel_thread=data.pixel_thread, match=self.match, pipeline=self.pipeline)
        ctx.state["model"] = outcome.state
        keys = self.reply_keys(ctx.model, ctx.rnd, ctx.train)["arrays"]
        arrays = {k: outcome.state[k].detach().to("cpu", copy=True) for k in keys}
        metrics = {"train_loss": outcome.train_loss, "bytes_sent": float(bytes_of(arrays)),
                   "elements_sent": float(sum(a.numel() for a in arrays.values())),
                   "selected_epoch": float(outcome.selected_epoch), "selected_val_map50": outcome.selected_val_map50}
        return ClientResult(arrays=arrays, num_examples=data.num_train, metrics=metrics)

    def personal_model(self, ctx: ClientContext):
        final = ctx.rnd - 1 >= ctx.train.rounds and self.skips_final()
        self._restore_own(ctx, everything=final)
        return ctx.model

    # --- server ------------------------------------------------------------------
    def aggregate(self, ctx: ServerContext) -> Arrays:
        log = ctx.state.setdefault("ultraflwr_clients", [])
        for pid, r in zip(ctx.pids, ctx.results, strict=True):
            log.append({"round": ctx.rnd, "client": pid, "num_examples": r.num_examples,
                        **{k: float(r.metrics.get(k, math.nan)) for k in
                           ("bytes_sent", "elements_sent", "selected_epoch", "selected_val_map50", "train_loss")}})
        sent = [r.arrays for r in ctx.results]
        if not any(sent):  # the omitted final aggregation: nothing was sent
            return ctx.global_arrays
        if self.aggregator == "median":
            new = median_arrays(sent)
        else:
            new = weighted_average(sent, fedavg_weights([r.num_examples for r in ctx.results], self.weighting))
        return {**moved(ctx.global_arrays, "cpu"), **new}  # the clients' arrays are CPU tensors: all on the host
