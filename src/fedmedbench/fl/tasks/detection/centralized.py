"""The paper's centralized baseline: each client trains alone on its own data for
rounds x epochs epochs in ONE Ultralytics run (no round boundaries), then is evaluated
ID/CD like the federated clients (mAP50 ID-C and CD-C of Tables II and III)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
import torch

from fedmedbench.fl.api.method import TrainConfig
from fedmedbench.fl.engine.federation import resolve_data_shapes, resolve_device
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.detection.task import DetectionTask
from fedmedbench.fl.tasks.detection.yolo import HEAD_INITS, build_yolo, train_yolo
from fedmedbench.workflow import io


def block_best(curve: list[float], rnd: int, epochs: int) -> float:
    """Figure 3's point of round-equivalent ``rnd``: the best validation mAP50 among its E epochs, the same
    kind of point as a federated client's (its model selected after E local epochs); NaN where the run
    had stopped early or nothing was validated."""
    block = [v for v in curve[(rnd - 1) * epochs: rnd * epochs] if not math.isnan(v)]
    return max(block) if block else math.nan


def start_seed(spec: RunSpec, data_seed: int, head_init: str) -> int:
    """The seed a client's centralized model is built under: its own Ultralytics seed (``client``: the
    trainer rebuilds the model under the run's seed, then loads the start weights; UltraFlwr's
    ``local_train_and_test.py`` passes none, i.e. Ultralytics' 0) or the run's seed (``common``)."""
    if head_init not in HEAD_INITS:
        raise ValueError(f"head_init must be one of {HEAD_INITS}, got '{head_init}'")
    return int(data_seed) if head_init == "client" else int(spec.seed)


#: the ultraflwr method parameters a centralized run takes (the rest are the federated strategy's)
OPTIONS = ("select", "select_metric", "ultralytics", "auto_optimizer", "head_init", "workers", "warmup", "assigner", "hsv", "ap",
           "match", "pipeline")


def run_centralized(spec: RunSpec, select: str = "best", select_metric: str = "fitness", ultralytics: dict | None = None,
                    log=print, auto_optimizer: str = "ultralytics_8_3", head_init: str = "client",
                    workers: int = 0, warmup: str = "ultralytics_8_3", assigner: str = "ultralytics_8_3",
                    hsv: str = "ultralytics_8_3", ap: str = "ultralytics_8_3", match: str = "ultralytics_8_3",
                    pipeline: str = "ultralytics_8_3") -> dict:
    """Train and evaluate every client alone; writes metrics.csv (per round-equivalent and client:
    Ultralytics validation mAP50), client_metrics.csv (row i of the ID/CD matrix per client),
    summary.json and model.pt (client 0... n-1)."""
    spec = resolve_data_shapes(spec)
    task = DetectionTask(spec)
    device = resolve_device(spec.device)
    tc = TrainConfig.from_spec(spec)
    epochs = int(tc.rounds * round(tc.local_epochs))
    t0 = time.monotonic()
    client_rows, curves, models = [], [], {}
    for pid in range(task.num_clients):
        data = task.client_data(pid)
        model = build_yolo(spec.model, int(spec.num_classes), seed=start_seed(spec, data.seed, head_init),
                           weights=spec.pretrained_path)
        out = train_yolo(model, data.data_yaml, epochs=epochs, batch=tc.batch_size, imgsz=data.imgsz, seed=data.seed,
                         device=device, workdir=f"{data.workdir}/centralized", select=select,
                         select_metric=select_metric, extra=ultralytics, auto_optimizer=auto_optimizer,
                         workers=workers, warmup=warmup, assigner=assigner, hsv=hsv, read_ahead=data.read_ahead, ap=ap,
                         pixel_thread=data.pixel_thread, match=match, pipeline=pipeline)
        model.load_state_dict(out.state)
        models[str(pid)] = out.state
        metrics = task.evaluate_client(model.to(device), data, device)
        client_rows.append({"round": tc.rounds, "client": pid, **metrics, "selected_epoch": out.selected_epoch})
        curves.append(out.val_map50)
        log(f"client {pid}: {epochs} epochs, ID mAP50 {metrics['local_map50']:.4f}, CD mAP50 {metrics['cd_map50']:.4f}")
    e = int(round(tc.local_epochs))
    rows = [{"round": r, "client": pid, "cval_map50": block_best(c, r, e)}
            for r in range(1, tc.rounds + 1) for pid, c in enumerate(curves)]
    run_dir = Path(spec.run_dir)
    io.write_csv(run_dir / "metrics.csv", pd.DataFrame(rows))
    io.write_csv(run_dir / "client_metrics.csv", pd.DataFrame(client_rows))
    with io.atomic_path(run_dir / "model.pt") as tmp:
        torch.save(models, tmp)
    summary = {"study": spec.study, "dataset": spec.dataset, "setting": spec.setting, "method": "centralized",
               "seed": spec.seed, "data_origin": spec.data_origin, "epochs": epochs, "num_clients": task.num_clients,
               "model": spec.model, "device": str(device), "task": spec.task, "wall_time_s": time.monotonic() - t0,
               "run_hash": spec.run_hash()}
    io.write_json(run_dir / "summary.json", summary)
    return summary
