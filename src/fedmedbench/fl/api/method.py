"""The method API: what a method implements and what it is given.

A method reads like its paper's algorithm box:

* :meth:`Method.client_fit` runs on a client for one round: it gets the broadcast
  global arrays already loaded into ``ctx.model``, the client's data, its persistent
  state (``ctx.state``, a dict that survives rounds and resume) and returns what the
  client sends back (:class:`ClientResult`). The default is local SGD on cross-entropy,
  shaped by two hooks: :meth:`Method.extra_loss` (a term added to each step's loss) and
  :meth:`Method.gradient_correction` (a vector added to each step's gradient).
* :meth:`Method.aggregate` runs on the server: old global arrays + client results ->
  new global arrays (and it may update ``server_state``, which is checkpointed).
* ``personalized`` methods evaluate each client's own model (``personal_model``)
  on the clients; others are evaluated as one global model on the server.
* ``centralized`` methods are run by the engine on the pooled training data as one
  client, with the same number of optimisation steps per round as the federation.

A method registers its name with :func:`fedmedbench.fl.api.registry.register_method` and declares its
hyper-parameters in ``params`` (:class:`~fedmedbench.fl.api.params.Param`; a subclass adds to its bases');
the array helpers it uses live in :mod:`fedmedbench.fl.api.arrays`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from fedmedbench.fl.api.arrays import Arrays, model_tensors, weighted_average
from fedmedbench.fl.api.params import Param, merged, resolve

if TYPE_CHECKING:
    from fedmedbench.fl.spec import RunSpec
    from fedmedbench.fl.state.slots import StateSlots

__all__ = ["Arrays", "ClientContext", "ClientData", "ClientResult", "Method", "Param", "ServerContext", "TrainConfig"]


@dataclass
class ClientData:
    """A client's tensors: uint8 images (N,C,H,W) and int64 labels, per part."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    #: ``client_augmentation: reference`` (fl/augment.py): the training images before their domain shift
    #: (uint8, rows as ``train_x``) and each one's acquisition device (c, b, sigma), so every read redraws
    #: the noise; None = training batches are the stored ``train_x`` as they are
    aug_x: torch.Tensor | None = None
    aug_device: torch.Tensor | None = None
    #: the same for the validation split (``client_augmentation: reference``: a client validating its own model
    #: reads its validation share as the authors' validation loader); None = ``val_x`` as stored
    val_aug_x: torch.Tensor | None = None
    val_aug_device: torch.Tensor | None = None

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])


@dataclass
class TrainConfig:
    """Local optimisation settings shared by every method (config ``train`` block)."""

    rounds: int
    local_epochs: float
    batch_size: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    lr_decay: float = 1.0  # multiplicative per round
    grad_clip: float | None = None
    eval_batch_size: int = 256
    aggregation: str = "examples"  # examples | uniform (FL-Simulator averages clients uniformly)
    autocast: str = "none"  # none | bf16: forward passes under bfloat16 autocast (GPU; also works on CPU)
    channels_last: bool = False  # NHWC memory layout for conv models (faster on GPUs with tensor cores)
    compile: bool = False  # torch.compile the training forward (traced once per architecture and shape in a process)
    input_norm: str = "single"  # single | double: the early-stopping code's second Normalize(0.5, 0.5)
    on_nonfinite: str = "error"  # error | continue: keep stepping through a NaN loss (early-stopping code)
    batch_clients: bool = False  # a round's clients trained together, one batched step for all (fl/methods/_together.py)
    seeds_together: bool = False  # the study's seeds of a job side by side in one process (fl/engine/runs_together.py)

    @classmethod
    def from_spec(cls, spec: RunSpec) -> TrainConfig:
        """The run's settings (its ``train`` block); a key this version does not know fails naming it."""
        unknown = sorted(set(spec.train) - {f.name for f in fields(cls)})
        if unknown:  # e.g. a spec file written by another version of the package
            raise ValueError(f"run spec: unknown train field(s) {unknown}; write the spec again with this version")
        return cls(**spec.train)

    def lr_at(self, rnd: int) -> float:
        return self.lr * (self.lr_decay ** (rnd - 1))


@dataclass
class ClientContext:
    """Everything a client step may use; ``state`` persists across rounds for this client."""

    pid: int
    rnd: int
    model: torch.nn.Module
    data: ClientData
    train: TrainConfig
    device: torch.device
    generator: torch.Generator
    state: dict[str, Any]
    steps: int  # optimisation steps this round (from epochs, or the centralized budget)
    global_arrays: Arrays = field(default_factory=dict)
    #: named array sets the server broadcast with this round (see ServerContext.broadcast)
    broadcast: dict[str, Arrays] = field(default_factory=dict)
    #: training examples of every client, by partition id (called when needed: SCAFFOLD's reference K)
    client_sizes: Callable[[], list[int]] | None = None
    #: steps of one local epoch for per-epoch losses; None = one pass over the training data
    #: (the centralized client's epoch is a local epoch's share of its round budget instead)
    epoch_steps: int | None = None
    #: where the job keeps its arrays (the global model, what clients send, a client's vectors): the job's
    #: device on the inline backend with an accelerator, else the CPU (``Job.place_arrays``)
    array_device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: where the job's reused model keeps its state entries (``result_arrays`` reads them without a
    #: ``state_dict()`` walk); None when ``model`` is built for this call
    slots: StateSlots | None = None
    #: a line for the job's log, each text said once a run (clients trained together: a round that falls back
    #: to one by one says why); None: not logged
    note: Callable[[str], None] | None = None

    def result_arrays(self, model: torch.nn.Module | None = None, keys: list[str] | None = None) -> Arrays:
        """What the client sends: copies of the model's state (``ctx.model`` by default) where the job
        keeps its arrays (``array_device``)."""
        model = self.model if model is None else model
        state = self.slots.state(keys) if self.slots is not None and self.slots.model is model else None
        return model_tensors(model, keys, state, self.array_device)

    def steps_per_epoch(self) -> int:
        """Steps of one local epoch: ``epoch_steps``, else ceil(n_train / B) (where batch_indices reshuffles)."""
        if self.epoch_steps:
            return int(self.epoch_steps)
        return max(1, math.ceil(self.data.num_train / self.train.batch_size))


@dataclass
class ServerContext:
    """What a server step may use; ``state`` persists across rounds and is checkpointed.

    ``state`` values must be tensors, numbers, strings or lists/dicts of them (the
    checkpoint is loaded with ``torch.load(weights_only=True)``).
    """

    rnd: int
    global_arrays: Arrays
    results: list[ClientResult]  # ordered by partition id
    pids: list[int]
    state: dict[str, Any]
    num_clients: int
    device: torch.device
    train: TrainConfig
    new_model: Callable[[], torch.nn.Module]
    #: named array sets sent to every client with the next rounds' global model (e.g.
    #: SCAFFOLD's server control variate, FedDG's amplitude bank). Set entries to send
    #: them; they persist (and are checkpointed) until replaced or deleted.
    broadcast: dict[str, Arrays] = field(default_factory=dict)
    #: the run's seed: a server step that draws random numbers seeds its own generator
    #: from (seed, rnd), so resumed runs repeat them exactly
    seed: int = 0
    #: threads a server step may use to read its own data ahead of use (``engine.loader_workers``): speed only
    loader_workers: int = 0
    #: the folder of decoded images shared by the jobs (``engine.image_cache``), or None: speed only
    image_cache: str | None = None


@dataclass
class ClientResult:
    arrays: Arrays
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    #: Extra array records a method declares (e.g. SCAFFOLD's control-variate delta).
    extras: dict[str, Arrays] = field(default_factory=dict)


#: what trains a round's clients together: (their contexts, their step hooks) -> per client (trained state,
#: metrics), in order (``_together.train_together``; ``fl/engine/runs_together.py`` merges several runs' rounds, where
#: hooks None says the round's clients train one by one)
Trainer = Callable[[list[ClientContext], list[Any] | None], list[tuple[Arrays, dict[str, float]]]]


class Method:
    """Base method = FedAvg-style client step (plain local SGD) + weighted averaging."""

    name = "base"
    #: the task whose runs it trains (RunSpec.task): classification, segmentation or detection
    task = "classification"
    #: this class's hyper-parameters (a config's ``method_params.<name>``), added to its bases'
    params: tuple[Param, ...] = ()
    personalized = False
    centralized = False
    #: names of extra records this method may send from a client (checked by the engine)
    extra_records: tuple[str, ...] = ()
    #: the client step works on data already on the device (the engine may then cache it there)
    device_data = False

    def __init__(self, **params: Any) -> None:
        #: every declared parameter's value: its default, or the given one (checked against its declaration)
        self.p: dict[str, Any] = resolve(self.name, self.declared_params(), params)

    @classmethod
    def declared_params(cls) -> dict[str, Param]:
        """Name -> declaration, the bases' first (a subclass may redeclare one, e.g. with another default)."""
        return merged(vars(k).get("params", ()) for k in reversed(cls.__mro__))

    # --- model -------------------------------------------------------------------
    def build_model(self, spec: RunSpec) -> torch.nn.Module:
        """The model a run trains (default: ``model.name`` from the registry)."""
        from fedmedbench.models import build_model

        return build_model(spec.model, spec.in_channels, spec.num_classes, spec.image_size, spec.pretrained_path)

    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        """state_dict keys that form the global model (broadcast and aggregated).

        Default: all of them. A method that keeps parts on the clients (a decoder, a
        personalised head) returns the rest and keeps those parts in ``ctx.state``.
        """
        return list(model.state_dict())

    def reply_keys(self, model: torch.nn.Module, rnd: int, train: TrainConfig) -> dict[str, list[str] | None]:
        """What a client's reply holds in round ``rnd``, by record: ``arrays`` and each extra record, as the
        model state keys its entries mirror (the server refuses other keys, shapes or dtypes:
        :mod:`fedmedbench.fl.engine.replies`), or None where the entries are not the model's (checked for finite
        values only). Default: the shared keys, and extra records not of the model. An extra record may be
        absent from a reply; ``arrays`` always holds exactly its keys."""
        return {"arrays": self.shared_keys(model), **{name: None for name in self.extra_records}}

    # --- client side -------------------------------------------------------------
    def client_fit(self, ctx: ClientContext) -> ClientResult:
        """``ctx.steps`` steps of local SGD on cross-entropy + :meth:`extra_loss`, each gradient
        + :meth:`gradient_correction` before clipping (``train.grad_clip``) and the optimizer step; sends the
        whole trained state."""
        from fedmedbench.fl.augment import batch_reader
        from fedmedbench.fl.training import StepLosses, local_sgd

        extra = None if type(self).extra_loss is Method.extra_loss else functools.partial(self.extra_loss, ctx)
        losses = StepLosses(ctx.steps_per_epoch())
        loss = local_sgd(ctx.model, ctx.data.train_x, ctx.data.train_y, ctx.steps, ctx.train, ctx.rnd, ctx.device, ctx.generator,
                         extra_loss=extra, losses=losses, images=batch_reader(ctx), correction=self.gradient_correction(ctx))
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train,
                            metrics={"train_loss": loss, **losses.epoch_metrics()})

    def extra_loss(self, ctx: ClientContext, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   logits: torch.Tensor) -> torch.Tensor | None:
        """A term added to the loss of every local step of :meth:`client_fit`, so its gradient joins the
        cross-entropy's (and is clipped with it): from the model being trained, the batch (``x`` the images as
        the model reads them, ``y`` the labels) and the model's ``logits`` on it. None (the default): nothing
        added. FedProx's mu/2 ||theta - theta_g||^2 is one: ``examples/methods/fedprox_hook.py``."""
        return None

    def gradient_correction(self, ctx: ClientContext) -> Arrays | None:
        """A vector d by trainable parameter name (``ctx.model.named_parameters()``), added to the gradient of
        every local step of :meth:`client_fit` after the backward pass, before clipping and the optimizer step:
        the gradient of a linear loss term <theta, d>, e.g. SCAFFOLD's c - c_i. Made once a round, before the
        steps (a term that changes with the weights is an :meth:`extra_loss`). None (the default): nothing."""
        return None

    def why_not_together(self, model: torch.nn.Module, train: TrainConfig) -> str | None:
        """Why this method cannot train a round's clients together (``train.batch_clients``); None where it can."""
        return f"method '{self.name}' trains its clients one by one"

    def fit_together(self, ctxs: list[ClientContext], trainer: Trainer | None = None) -> list[ClientResult] | None:
        """The clients of ``ctxs`` (one shared model holding the global weights) trained together, their
        results in order; None where this round's clients cannot be (they then train one by one).
        ``trainer``: what runs the batched steps (default ``_together.train_together``; several runs side by
        side hand in theirs, which trains their rounds in one call)."""
        return None

    def personal_model(self, ctx: ClientContext) -> torch.nn.Module:
        """The model a personalized client is evaluated with (default: the global one)."""
        return ctx.model

    # --- server side -------------------------------------------------------------
    def aggregate(self, ctx: ServerContext) -> Arrays:
        """New global arrays from this round's client results."""
        return weighted_average([r.arrays for r in ctx.results], [r.num_examples for r in ctx.results])

