"""RunSpec: everything one training job needs, resolved from config by the rule.

It is JSON-serialisable (it travels through Snakemake ``params:`` and into Ray
actors) and hashable: the hash of the fields that change results guards resume
(a checkpoint written under other settings is never resumed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: fields that do not change the numbers a run produces
_NOT_HASHED = {"run_dir", "threads", "log_every", "backend", "keep_checkpoints", "resume", "cache_on_device",
               "deterministic", "loader_workers", "image_cache", "pixel_thread", "tracking", "method_file"}
#: fields a job's script sets from its Snakemake job and the config, never from ``params:``: they change
#: how a run executes, not its numbers, so changing them reruns no finished job
RUNTIME_FIELDS = ("threads", "log_every", "backend", "keep_checkpoints", "resume", "cache_on_device",
                  "deterministic", "loader_workers", "image_cache", "pixel_thread", "tracking")
RESUME_MODES = ("auto", "restart")
#: the config's ``engine`` entries a spec takes: how a job runs, never what it computes
ENGINE_OPTIONS = ("backend", "cache_on_device", "deterministic", "loader_workers", "image_cache", "pixel_thread")


def engine_options(config: dict[str, Any]) -> dict[str, Any]:
    """The spec fields from the config's ``engine`` block (read at run time, not from the rule's params)."""
    return {k: config["engine"][k] for k in ENGINE_OPTIONS if k in config["engine"]}


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
    #: whose draws pick each round's clients: project, reference, reference_cache_build (partition/replay.py)
    random_draws: str = "project"
    method_params: dict[str, Any] = field(default_factory=dict)
    #: a user's method (config ``methods``): the file that registers it, loaded by the job (not hashed: where
    #: it is), and the SHA-256 of its content (hashed: an edit reruns its jobs); None for built-in methods
    method_file: str | None = None
    method_sha256: str | None = None
    device: str = "auto"
    threads: int = 1
    #: Flower backend: inline (in-process grid, default) or ray (run_simulation); see fl/engine/flower.py
    backend: str = "inline"
    #: copy client data to an accelerator once per job while it fits (fl/engine/job.py); never changes results
    cache_on_device: bool = True
    #: deterministic GPU kernels (fl/determinism.py): a rerun or a resumed run gives the same bits; the same
    #: arithmetic, so not hashed; no effect on the CPU
    deterministic: bool = False
    #: parallel reading of surgical images: DataLoader worker processes of the detection evaluation
    #: (Ultralytics' validator reads the images in order) and, from 1, the detection training's batches read
    #: ahead in one thread (fl/tasks/detection/read_ahead.py), threads decoding the segmentation clips ahead
    #: of use (fl/tasks/segmentation/clips.py); the same results either way: speed only, not hashed
    loader_workers: int = 0
    #: a folder where the surgical jobs keep the images they read decoded, shared by every job
    #: (fl/tasks/detection/frame_cache.py, fl/tasks/clip_store.py): the same arrays as decoding, so the
    #: same results without the decode; None = decode every read. Not hashed
    image_cache: str | None = None
    #: ultraflwr's training loaded in the job's process (``workers=0``): each sample's last pixel steps in one more
    #: thread while the loader draws the next (fl/tasks/detection/pixel_thread.py): the same samples, so not hashed
    pixel_thread: bool = True
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
    #: after local training each client evaluates its own model on its validation split (client_val_* columns,
    #: averaged over clients: ``mean`` = plain, ``weighted`` = by validation examples); None = off (GPAF Fig. 5a)
    client_validation: str | None = None
    #: the study's ``client_augmentation`` when not none: {"mode": "reference", "domains": the config's domain
    #: steps, "domain_seed": ...}; clients then read their training batches as the GPAF authors' loader
    #: (fl/augment.py, fl/data.py); None = the stored images as they are
    client_augmentation: dict[str, Any] | None = None
    #: what is learnt and how it is evaluated (fl/tasks/); task_params are the task's options
    task: str = "classification"
    task_params: dict[str, Any] = field(default_factory=dict)
    #: weight set -> SHA-256 of the file the job loads (filled at job start from the manifests), so a
    #: checkpoint written with other weights is never resumed
    weights_sha256: dict[str, str] = field(default_factory=dict)
    #: keep checkpoint/ (server state, client states) after the run completed; default: removed
    keep_checkpoints: bool = False
    #: auto = resume from a matching checkpoint; restart = discard it and start at round 0
    resume: str = "auto"
    #: the config's ``tracking`` block (fl/tracking.py: TensorBoard, MLflow, W&B); reads metrics only, not hashed
    tracking: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:  # e.g. a spec file written by another version of the package
            raise ValueError(f"run spec: unknown field(s) {unknown}; write the spec again with this version")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.from_dict(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    def run_hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in _NOT_HASHED}
        # fields at their defaults are left out, so runs from before a field existed keep their hash
        if not d["save_client_models"]:
            del d["save_client_models"]
        if d["client_models_round"] is None:
            del d["client_models_round"]
        if d["client_validation"] is None:
            del d["client_validation"]
        if d["client_augmentation"] is None:
            del d["client_augmentation"]
        if not d["weights_sha256"]:
            del d["weights_sha256"]
        if d["random_draws"] == "project":
            del d["random_draws"]
        if d["method_sha256"] is None:
            del d["method_sha256"]
        if d["task"] == "classification" and not d["task_params"]:
            del d["task"], d["task_params"]
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def result_params(spec: dict[str, Any]) -> dict[str, Any]:
    """A RunSpec dict without its runtime fields: what a rule's ``params:`` carries."""
    return {k: v for k, v in spec.items() if k not in RUNTIME_FIELDS}


def for_job(params_spec: dict[str, Any], threads: int, config: dict[str, Any], log_every: int | None = None) -> RunSpec:
    """The RunSpec of a Snakemake job: result fields from ``params``, runtime fields from the job and config."""
    d = result_params(params_spec)
    d.update(threads=int(threads), keep_checkpoints=bool(config.get("keep_checkpoints", False)),
             resume=config.get("resume", "auto"), tracking=dict(config.get("tracking") or {}), **engine_options(config))
    if log_every is not None:
        d["log_every"] = int(log_every)
    return RunSpec.from_dict(d)
