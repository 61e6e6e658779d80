"""Client/server contexts built by hand, to test a method's steps without Flower."""

from __future__ import annotations

import torch

from fedmedbench.fl.api import ClientContext, ClientData, Method, ServerContext, TrainConfig
from fedmedbench.fl.api.arrays import load_arrays, model_arrays
from fedmedbench.fl.engine.federation import client_generator
from fedmedbench.fl.spec import RunSpec


def toy_data(n: int = 96, channels: int = 1, classes: int = 2, seed: int = 0) -> ClientData:
    """Learnable toy images: class c has a bright square at a class-specific place."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randint(0, 60, (n, channels, 28, 28), generator=g).to(torch.uint8)
    for i, c in enumerate(y.tolist()):
        r = 4 + 6 * (c % 3)
        x[i, :, r : r + 6, r : r + 6] = 220
    k = n // 4
    return ClientData(x, y, x[:k], y[:k], x[:k], y[:k])


def toy_spec(method: str, channels: int = 1, classes: int = 2, model: str = "gpaf_cnn") -> RunSpec:
    return RunSpec(run_dir="unused", study="t", dataset="breastmnist", setting="s", method=method, seed=0,
                   partition_path="unused", sources={}, image_size=28, in_channels=channels, num_classes=classes,
                   model=model)


def train_config(**kw) -> TrainConfig:
    return TrainConfig(**{"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 1e-3, "optimizer": "adam", **kw})


def fresh_global(method: Method, spec: RunSpec, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = method.build_model(spec)
    return model_arrays(model, method.shared_keys(model))


def client_ctx(method: Method, spec: RunSpec, arrays: dict, data: ClientData, *, pid: int = 0, rnd: int = 1,
               steps: int = 4, state: dict | None = None, broadcast: dict | None = None, cfg: TrainConfig | None = None,
               seed: int = 0) -> ClientContext:
    model = method.build_model(spec)
    load_arrays(model, arrays, method.shared_keys(model))
    return ClientContext(pid=pid, rnd=rnd, model=model, data=data, train=cfg or train_config(), device=torch.device("cpu"),
                         generator=client_generator(seed, rnd, pid), state={} if state is None else state, steps=steps,
                         global_arrays=arrays, broadcast=broadcast or {})


def server_ctx(method: Method, spec: RunSpec, arrays: dict, results: list, *, rnd: int = 1, state: dict | None = None,
               broadcast: dict | None = None) -> ServerContext:
    return ServerContext(rnd=rnd, global_arrays=arrays, results=results, pids=list(range(len(results))),
                         state={} if state is None else state, num_clients=len(results), device=torch.device("cpu"),
                         train=train_config(), new_model=lambda: method.build_model(spec), broadcast=broadcast or {}, seed=0)
