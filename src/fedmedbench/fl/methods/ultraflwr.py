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

from fedmedbench.fl.api import Arrays, ClientContext, ClientResult, Method, ServerContext
from fedmedbench.fl.arrays import load_arrays, weighted_average
from fedmedbench.fl.registry import register_method
from fedmedbench.fl.tasks.detection.ap import AP_RULES
from fedmedbench.fl.tasks.detection.components import SPLITS, aggregated_keys, parse_strategy
from fedmedbench.fl.tasks.detection.yolo import (
    ASSIGNERS,
    AUTO_OPTIMIZERS,
    HEAD_INITS,
    HSV_RULES,
    SELECT,
    SELECT_METRICS,
    WARMUPS,
    one_of,
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
    """Coordinate-wise median per key (Flower's FedMedian), cast back to each key's dtype."""
    if not arrays:
        raise ValueError("nothing to aggregate: no client results")
    return {k: np.median(np.stack([a[k] for a in arrays]), axis=0).astype(arrays[0][k].dtype) for k in arrays[0]}


def bytes_of(arrays: Arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays.values()))


@register_method("ultraflwr")
class UltraFlwr(Method):
    personalized = True  # partial strategies leave each client its own model; all are evaluated per client

    def __init__(self, strategy: str = "FedAvg", split: str = "ultraflwr", select: str = "best",
                 select_metric: str = "fitness", weighting: str = "uniform", final_aggregation: str = "skip_all",
                 ultralytics: dict | None = None, auto_optimizer: str = "ultralytics_8_3",
                 head_init: str = "client", workers: int = 0, warmup: str = "ultralytics_8_3",
                 assigner: str = "ultralytics_8_3", hsv: str = "ultralytics_8_3", ap: str = "ultralytics_8_3") -> None:
        self.components, self.aggregator = parse_strategy(strategy)
        self.strategy = strategy

        def checked(key: str, value: str, choices: tuple) -> str:
            return one_of(f"method_params.ultraflwr.{key}", value, choices)

        self.split, self.select = checked("split", split, SPLITS), checked("select", select, SELECT)
        self.select_metric = checked("select_metric", select_metric, SELECT_METRICS)
        self.weighting = checked("weighting", weighting, WEIGHTING)
        self.final_aggregation = checked("final_aggregation", final_aggregation, FINAL_AGGREGATION)
        # where Ultralytics 8.4 (installed) trains differently from UltraFlwr's 8.3.48 (yolo.py's module docstring)
        self.auto_optimizer = checked("auto_optimizer", auto_optimizer, AUTO_OPTIMIZERS)
        self.warmup, self.assigner = checked("warmup", warmup, WARMUPS), checked("assigner", assigner, ASSIGNERS)
        self.hsv = checked("hsv", hsv, HSV_RULES)
        self.ap = checked("ap", ap, AP_RULES)
        self.head_init = checked("head_init", head_init, HEAD_INITS)
        self.ultralytics = dict(ultralytics or {})
        if int(workers) < 0:
            raise ValueError(f"method_params.ultraflwr.workers must be >= 0, got {workers}")
        self.workers = int(workers)

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

    # --- client ------------------------------------------------------------------
    def _restore_own(self, ctx: ClientContext, everything: bool) -> None:
        """Load the client's own weights: the non-aggregated components (or all of them)."""
        own = ctx.state.get("model")
        if not own:
            return  # first training: the server's model
        shared = set(self.shared_keys(ctx.model))
        keys = list(own) if everything else [k for k in own if k not in shared]
        load_arrays(ctx.model, {k: own[k].numpy() for k in keys}, keys)

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
                             assigner=self.assigner, hsv=self.hsv, read_ahead=data.read_ahead, ap=self.ap)
        ctx.state["model"] = outcome.state
        last = ctx.rnd >= ctx.train.rounds
        keys = [] if (last and self.skips_final()) else self.shared_keys(ctx.model)
        arrays = {k: outcome.state[k].numpy().copy() for k in keys}
        metrics = {"train_loss": outcome.train_loss, "bytes_sent": float(bytes_of(arrays)),
                   "elements_sent": float(sum(a.size for a in arrays.values())),
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
        return {**ctx.global_arrays, **new}
