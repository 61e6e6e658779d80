"""After FedST training: the deployed model (shared arrays + the sites' averaged personal
parameters) evaluated on the out-of-federation site and the unseen binary set, with its
communication and inference cost (Tables III and VIII)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch


def deployed_model(spec, method, final_arrays: dict[str, torch.Tensor], sizes: list[int]) -> torch.nn.Module:
    """The model used on unseen sites: shared arrays + the size-weighted average of the sites'
    personal parameters (FedST Sec. IV-B2: "we aggregate the parameters of personalized
    models on the server via weighted averaging"). This is the only point where personal
    parameters are combined; it happens after training, from the sites' final states."""
    from fedmedbench.fl.api.arrays import load_arrays, weighted_average
    from fedmedbench.fl.state import checkpoint
    from fedmedbench.fl.state.client_state import ClientStateStore

    model = method.build_model(spec)
    shared = [k for k in method.shared_keys(model) if k in final_arrays]
    load_arrays(model, final_arrays, shared)
    if method.personalized:
        store = ClientStateStore(checkpoint.checkpoint_dir(spec.run_dir) / "clients")
        states = [store.load(pid, before_round=10**9).get("personal") for pid in range(len(sizes))]
        if any(s is None for s in states):
            missing = [i for i, s in enumerate(states) if s is None]
            raise RuntimeError(f"{spec.run_dir}: no final personal state for client(s) {missing}")
        arrays = [{k: v for k, v in s.items() if k != "cs.indicator"} for s in states]
        if arrays[0]:
            load_arrays(model, weighted_average(arrays, [float(n) for n in sizes]), list(arrays[0]))
    return model


def communication_mb(method, model: torch.nn.Module) -> float:
    """MB one client uploads per round: the trainable parameters among the shared entries (float32)."""
    if not getattr(method, "communicates", True):
        return 0.0
    shared = set(method.shared_keys(model))
    n = sum(p.numel() for name, p in model.named_parameters() if name in shared and p.requires_grad)
    return n * 4 / 2**20


@torch.no_grad()
def inference_fps(model: torch.nn.Module, clips, n: int, device: torch.device) -> float:
    """Frames per second of single-clip inference (batch 1) over the first ``n`` clips."""
    model.eval()
    n = min(n, len(clips))
    if n == 0:
        return math.nan
    batches = [clips.batch([i])[0].to(device) for i in range(n)]  # reading files is not inference
    model(batches[0])  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for x in batches:
        model(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def deploy_eval(spec, state, outfed_site: str, unseen_site: str, fps_clips: int) -> dict[str, Any]:
    """Out-of-federation (parts) and unseen (binary) metrics of the deployed model, plus cost."""
    from fedmedbench.fl.api.registry import get_method
    from fedmedbench.fl.engine.federation import new_model, resolve_device
    from fedmedbench.fl.tasks.base import task_for
    from fedmedbench.fl.tasks.segmentation import evaluate_clips

    method = get_method(spec.method, spec.method_params)
    task = task_for(spec)
    dev = resolve_device(spec.device)
    model = deployed_model(spec, method, state.arrays, task.client_sizes()).to(dev)
    bs = int(spec.task_params.get("eval_batch_size", 8))
    out: dict[str, Any] = {"outfed_site": outfed_site, "unseen_site": unseen_site}
    e = task.site(outfed_site)
    model.set_indicator(e.indicator)
    out.update({f"outfed_{k}": v for k, v in evaluate_clips(model, e.test, task.classes, dev, bs, **task.scoring).items()})
    u = task.site(unseen_site)
    model.set_indicator(u.indicator)
    out.update({f"unseen_{k}": v for k, v in evaluate_clips(model, u.test, task.classes, dev, bs, binary=True,
                                                                     **task.scoring).items()})
    out["comm_mb_per_round"] = communication_mb(method, new_model(spec))
    out["train_time_s"] = float(state.elapsed)
    out["server_time_s"] = float(state.server_state.get("server_time_s", 0.0))  # SERQ; other servers only average
    out["local_time_s"] = out["train_time_s"] - out["server_time_s"]
    out["input_size"] = spec.task_params.get("input_size")
    out["fps"] = inference_fps(model, e.test, fps_clips, dev)
    out["frames_per_clip"] = len(spec.task_params["model"]["pools"]) if spec.task_params["model"].get("temporal") else 1
    return out
