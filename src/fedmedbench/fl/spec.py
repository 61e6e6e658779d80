"""RunSpec: everything one training job needs, resolved from config by the rule.

It is JSON-serialisable (it travels through Snakemake ``params:`` and into Ray
actors) and hashable: the hash of the fields that change results guards resume
(a checkpoint written under other settings is never resumed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from fedmedbench.fl.registry import TrainConfig

#: fields that do not change the numbers a run produces
_NOT_HASHED = {"run_dir", "threads", "log_every", "backend"}


@dataclass
class RunSpec:
    run_dir: str
    study: str
    dataset: str
    setting: str
    method: str
    seed: int
    partition_path: str
    sources: dict[str, str]
    image_size: int
    in_channels: int | None = None  # filled from the data by resolve_data_shapes
    num_classes: int | None = None
    model: str = "cnn_small"
    pretrained_path: str | None = None
    train: dict[str, Any] = field(default_factory=dict)
    clients_per_round: int | None = None  # None = all clients every round
    method_params: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    threads: int = 1
    #: Flower backend: inline (in-process grid, default) or ray (run_simulation); see fl/engine.py
    backend: str = "inline"
    data_origin: str = "synthetic"
    log_every: int = 1
    eval_every: int = 1
    #: data-free early stopping: mode none|datafree, tau, patience (see fl/stopping.py)
    early_stopping: dict[str, Any] = field(default_factory=lambda: {"mode": "none", "tau": 0.01, "patience": 10})
    #: also write the last round's client models (what clients sent) to client_models.pt
    save_client_models: bool = False
    #: the round whose client models ``save_client_models`` keeps (None = the last round); an earlier
    #: round also keeps that round's global arrays (``"global"`` in client_models.pt), e.g. GPAF Fig. 4
    client_models_round: int | None = None
    #: what is learnt and how it is evaluated (fl/tasks.py); task_params are the task's options
    task: str = "classification"
    task_params: dict[str, Any] = field(default_factory=dict)
    #: weight set -> SHA-256 of the file the job loads (filled at job start from the manifests), so a
    #: checkpoint written with other weights is never resumed
    weights_sha256: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.from_dict(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    def train_config(self) -> TrainConfig:
        return TrainConfig(**self.train)

    def run_hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in _NOT_HASHED}
        # fields at their defaults are left out, so runs from before a field existed keep their hash
        if not d["save_client_models"]:
            del d["save_client_models"]
        if d["client_models_round"] is None:
            del d["client_models_round"]
        if not d["weights_sha256"]:
            del d["weights_sha256"]
        if d["task"] == "classification" and not d["task_params"]:
            del d["task"], d["task_params"]
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
