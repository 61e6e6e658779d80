"""FedST's synthetic pre-training (Algorithm 1, input v_pre^0): the job behind ``fedst_pretrain``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


def pretrain(params: dict[str, Any], seed: int, out: str | Path, device: str = "cpu", log=print,
             loader_workers: int = 0, image_cache: str | None = None) -> None:
    """Synthetic pre-training (Algorithm 1 input v_pre^0): the FedST network on the simulator clips.

    The simulator's still frames carry no motion, so the temporal module is bypassed here (as
    in SERQ) and learns only from the sites' videos. ``loader_workers`` threads decode clips ahead
    of the steps (``engine.loader_workers``), and ``image_cache`` keeps the decoded clips on disk for every
    job (``engine.image_cache``); the same model either way."""
    from fedmedbench.fl.api.method import TrainConfig
    from fedmedbench.fl.engine.federation import resolve_device
    from fedmedbench.fl.tasks.segmentation import (
        FrameCache,
        input_size,
        load_clipset,
        load_sites,
        site_indicators,
        train_steps,
    )
    from fedmedbench.models.fedst import build_fedst_net, dropout_generator
    from fedmedbench.workflow.io import atomic_path

    sites = load_sites(params["clips_root"])["sites"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = build_fedst_net(params["model"])
    data = load_clipset(params["clips_root"], params["site"], None, len(params["model"]["pools"]),
                        input_size(params.get("input_size")),
                        FrameCache(int(params.get("cache_mb", 2048)) * 2**20, int(loader_workers), image_cache))
    dev = resolve_device(device)
    model.to(dev).set_indicator(site_indicators(sites, params["indicator"])[params["site"]])
    model.set_generator(dropout_generator(torch.Generator().manual_seed(int(seed))))
    steps = int(params["steps"]) if params.get("enabled", True) else 0
    t0 = time.monotonic()
    if steps:
        train = TrainConfig(rounds=1, local_epochs=1, batch_size=int(params["batch_size"]), lr=float(params["lr"]), optimizer="adam")
        loss = train_steps(model, data, steps, train, train.lr, dev, torch.Generator().manual_seed(int(seed)), params["loss"],
                           temporal=False)
        log(f"pre-trained {steps} steps on {len(data)} synthetic clips of site {params['site']}: loss {loss:.4f}")
    else:
        log("pre-training disabled: the sites start from the random initialisation")
    state = {k: v.cpu() for k, v in model.state_dict().items() if k != "cs.indicator"}
    with atomic_path(Path(out)) as tmp:
        torch.save({**state, "_pretrain_steps": torch.tensor(steps), "_pretrain_s": torch.tensor(time.monotonic() - t0)}, tmp)
