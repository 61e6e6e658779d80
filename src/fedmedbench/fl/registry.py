"""Method registry: method name -> a ``Method`` (client step + server step + state).

A method reads like its paper's algorithm box:

* :meth:`Method.client_fit` runs on a client for one round: it gets the broadcast
  global arrays already loaded into ``ctx.model``, the client's data, its persistent
  state (``ctx.state``, a dict that survives rounds and resume) and returns what the
  client sends back (:class:`ClientResult`).
* :meth:`Method.aggregate` runs on the server: old global arrays + client results ->
  new global arrays (and it may update ``server_state``, which is checkpointed).
* ``personalized`` methods evaluate each client's own model (``personal_model``)
  on the clients; others are evaluated as one global model on the server.
* ``centralized`` methods are run by the engine on the pooled training data as one
  client, with the same number of optimisation steps per round as the federation.

Adding a method = one file in ``fl/methods`` decorated with :func:`register_method`, named in
:data:`BUILTIN_METHOD_MODULES`. Methods register when first looked up, so importing this registry
(or one method file) loads no other method.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from fedmedbench.fl.spec import RunSpec
    from fedmedbench.fl.state_slots import StateSlots

#: a model's state by key: NumPy arrays on the host; on the inline backend, for a method with
#: ``device_arrays``, torch tensors on the job's device (no host round trip per client)
Arrays = dict[str, np.ndarray]

METHODS: dict[str, type[Method]] = {}


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    def deco(cls: type[Method]) -> type[Method]:
        cls.name = name
        METHODS[name] = cls
        return cls

    return deco


def get_method(name: str, params: dict[str, Any] | None = None) -> Method:
    _load_builtin_methods(name)
    if name not in METHODS:
        raise KeyError(f"unknown method '{name}'; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name](**(params or {}))


def available_methods() -> list[str]:
    _load_builtin_methods()
    return sorted(METHODS)


#: modules whose import registers a method (one file per method; the FedST study's first)
BUILTIN_METHOD_MODULES: tuple[str, ...] = tuple(f"fedmedbench.fl.methods.{m}" for m in (
    "fedas", "feddp", "fedld", "fedrep", "fedst", "fedst_base",
    "centralized", "fedavg", "feddg", "feddyn", "fedgamma", "fedlesam", "fedprox", "fedsam", "fedsmoo", "fedspeed",
    "fedwmsam", "gpaf", "local", "moon", "scaffold", "ultraflwr",
))
#: methods registered by a module of another name (the rest live in ``fl/methods/<name>.py``)
METHOD_MODULE_OF: dict[str, str] = {n: "fedmedbench.fl.methods.fedst_base" for n in ("seg_local", "seg_centralized", "seg_fedavg")}


def _load_builtin_methods(name: str | None = None) -> None:
    """Import the module that registers ``name`` (only it: a classification job never imports the
    surgical methods' libraries); every built-in method module when ``name`` is None or not built in."""
    import importlib

    if name in METHODS:
        return
    module = METHOD_MODULE_OF.get(name or "", f"fedmedbench.fl.methods.{name}")
    for m in [module] if module in BUILTIN_METHOD_MODULES else BUILTIN_METHOD_MODULES:
        importlib.import_module(m)


@dataclass
class ClientData:
    """A client's tensors: uint8 images (N,C,H,W) and int64 labels, per part."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

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
    #: send results as tensors on the device (the job's arrays live there; see Method.device_arrays)
    device_arrays: bool = False
    #: where the job's reused model keeps its state entries (``result_arrays`` reads them without a
    #: ``state_dict()`` walk); None when ``model`` is built for this call
    slots: StateSlots | None = None

    def result_arrays(self, model: torch.nn.Module | None = None, keys: list[str] | None = None) -> Arrays:
        """What the client sends: the model's state (``ctx.model`` by default) as NumPy arrays, or
        as device tensors when the job keeps its arrays on the device."""
        model = self.model if model is None else model
        state = self.slots.state(keys) if self.slots is not None and self.slots.model is model else None
        return model_tensors(model, keys, state) if self.device_arrays else model_arrays(model, keys, state)

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


class Method:
    """Base method = FedAvg-style client step (plain local SGD) + weighted averaging."""

    name = "base"
    personalized = False
    centralized = False
    #: names of extra records this method may send from a client (checked by the engine)
    extra_records: tuple[str, ...] = ()
    #: the client step works on data already on the device (the engine may then cache it there)
    device_data = False
    #: client and server steps take Arrays whose values are torch tensors on the job's device
    #: (every array operation goes through the tensor-aware helpers: ``ClientContext.result_arrays``,
    #: ``weighted_average``, ``as_tensors``); the inline backend then keeps the model on the device
    device_arrays = False

    def __init__(self, **params: Any) -> None:
        if params:
            raise TypeError(f"method '{self.name}' got unknown parameter(s) {sorted(params)} (method_params.{self.name})")

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

    # --- client side -------------------------------------------------------------
    def client_fit(self, ctx: ClientContext) -> ClientResult:
        from fedmedbench.fl.training import StepLosses, local_sgd

        losses = StepLosses(ctx.steps_per_epoch())
        loss = local_sgd(ctx.model, ctx.data.train_x, ctx.data.train_y, ctx.steps, ctx.train, ctx.rnd, ctx.device, ctx.generator,
                         losses=losses)
        return ClientResult(arrays=ctx.result_arrays(), num_examples=ctx.data.num_train,
                            metrics={"train_loss": loss, **losses.epoch_metrics()})

    def personal_model(self, ctx: ClientContext) -> torch.nn.Module:
        """The model a personalized client is evaluated with (default: the global one)."""
        return ctx.model

    # --- server side -------------------------------------------------------------
    def aggregate(self, ctx: ServerContext) -> Arrays:
        """New global arrays from this round's client results."""
        return weighted_average([r.arrays for r in ctx.results], [r.num_examples for r in ctx.results])


def model_arrays(model: torch.nn.Module, keys: list[str] | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> Arrays:
    """state_dict entries (parameters and buffers) as numpy arrays on the CPU, in order (``state``: the
    model's state_dict entries already at hand, e.g. from its ``StateSlots``)."""
    state = model.state_dict() if state is None else state
    return {k: state[k].detach().cpu().numpy().copy() for k in (keys if keys is not None else state)}


def model_tensors(model: torch.nn.Module, keys: list[str] | None = None,
                  state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """state_dict entries copied where they are (the device): one copy kernel per dtype, each
    entry a view of its dtype's flat buffer (``state`` as in :func:`model_arrays`)."""
    state = model.state_dict() if state is None else state
    return snapshot({k: state[k] for k in (keys if keys is not None else state)})


def snapshot(tensors: dict[str, torch.Tensor], device: torch.device | str | None = None,
             dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Detached copies of ``tensors`` (same shapes; on ``device`` and as ``dtype``, by default where and
    as each is), made per (device, dtype) group by one copy instead of one per entry: of the memory the
    group already covers back to back (views of one flat buffer, as this function and a state file read
    give), else of one concatenation. Each copy is a view of its group's new flat buffer."""
    groups: dict[tuple, list[str]] = {}
    for k, t in tensors.items():
        groups.setdefault((t.device, t.dtype), []).append(k)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for (where, kind), keys in groups.items():
            parts = [tensors[k].detach() for k in keys]
            target = where if device is None else torch.device(device)
            flat = _tiled(parts)
            if flat is None:  # the concatenation is a new buffer; .to moves or converts it only where asked
                flat = torch.cat([t.reshape(-1) for t in parts]).to(target, dtype or kind)
            else:
                flat = flat.to(target, dtype or kind, copy=True)
            for k, t, piece in zip(keys, parts, flat.split([t.numel() for t in parts]), strict=True):
                out[k] = piece.view(t.shape)
    return {k: out[k] for k in tensors}


def _tiled(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The flat view of the memory ``parts`` cover back to back, in order, in one storage; None otherwise."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    start = end = first.storage_offset()
    for t in parts:
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != storage or t.storage_offset() != end:
            return None
        end += t.numel()
    return first.as_strided((end - start,), (1,), start)


def is_tensor_arrays(arrays: Arrays) -> bool:
    """True when the values are torch tensors (a job that keeps its arrays on the device)."""
    return bool(arrays) and isinstance(next(iter(arrays.values())), torch.Tensor)


def as_tensors(arrays: Arrays, device: torch.device | str) -> dict[str, torch.Tensor]:
    """``arrays`` as tensors on ``device`` (NumPy arrays are copied; tensors already there pass through)."""
    return {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v, order="C", copy=True))).to(device)
            for k, v in arrays.items()}


def arrays_to_tensors(arrays: Arrays) -> dict[str, torch.Tensor]:
    """Arrays -> CPU tensors of the same shape (0-d stays 0-d, unlike ascontiguousarray), owning their memory."""
    return {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor)
            else torch.from_numpy(np.array(v, order="C", copy=True)) for k, v in arrays.items()}


def host_tensors(arrays: Arrays) -> dict[str, torch.Tensor]:
    """:func:`arrays_to_tensors` with the tensor values copied to the host by one transfer per (device,
    dtype) (:func:`snapshot`: views of one buffer each). For what a state file writes (each tensor's own
    bytes); ``torch.save`` would store the shared buffer instead (``model.pt`` keeps
    :func:`arrays_to_tensors`)."""
    copied = snapshot({k: v for k, v in arrays.items() if isinstance(v, torch.Tensor)}, "cpu")
    rest = arrays_to_tensors({k: v for k, v in arrays.items() if k not in copied})
    return {k: copied[k] if k in copied else rest[k] for k in arrays}


def load_arrays(model: torch.nn.Module, arrays: Arrays, keys: list[str] | None = None) -> None:
    """Load ``arrays`` into the model; ``keys`` (default: all) must all be present, shapes must match."""
    full = model.state_dict()
    keys = list(full) if keys is None else keys
    missing = set(keys) - set(arrays)
    if missing:
        raise KeyError(f"arrays lack model keys: {sorted(missing)[:5]}")
    state = {k: full[k] for k in keys}
    wrong = [k for k in state if tuple(np.shape(arrays[k])) != tuple(state[k].shape)]
    if wrong:
        k = wrong[0]
        raise ValueError(f"array '{k}' has shape {np.shape(arrays[k])}, the model expects {tuple(state[k].shape)}")
    model.load_state_dict({k: torch.as_tensor(arrays[k]).to(state[k].dtype) for k in state}, strict=len(state) == len(full))


def weighted_average(arrays: list[Arrays], weights: list[float]) -> Arrays:
    """Weighted mean per key (float64 accumulation); integer buffers are rounded back. Tensor
    arrays are averaged where they are (the device), with the same operations in the same order."""
    if not arrays:
        raise ValueError("nothing to aggregate: no client results")
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError(f"aggregation weights must sum to > 0, got {weights}")
    w = w / w.sum()
    if is_tensor_arrays(arrays[0]):
        return _weighted_average_tensors(arrays, w)
    out: Arrays = {}
    for key in arrays[0]:
        acc = sum(wi * a[key].astype(np.float64) for wi, a in zip(w, arrays, strict=True))
        dtype = arrays[0][key].dtype
        out[key] = np.asarray(np.rint(acc) if np.issubdtype(dtype, np.integer) else acc).astype(dtype)
    return out


def _weighted_average_tensors(arrays: list[dict[str, torch.Tensor]], w: np.ndarray) -> dict[str, torch.Tensor]:
    """:func:`weighted_average` on tensors: per dtype group one flat float64 accumulator,
    ``0 + w_0 a_0 + w_1 a_1 + ...`` term by term as the NumPy path sums, then cast back (integers rounded
    half to even, as ``np.rint``)."""
    first = arrays[0]
    groups: dict[tuple, list[str]] = {}
    for k, t in first.items():
        groups.setdefault((t.device, t.dtype), []).append(k)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for (device, dtype), keys in groups.items():
            sizes = [first[k].numel() for k in keys]
            acc = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
            for wi, a in zip(w, arrays, strict=True):
                flat = torch.cat([a[k].detach().reshape(-1) for k in keys]).to(torch.float64)
                acc.add_(flat.mul_(float(wi)))
            if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
                acc = torch.round(acc)
            for k, piece in zip(keys, acc.to(dtype).split(sizes), strict=True):
                out[k] = piece.view(first[k].shape)
    return {k: out[k] for k in first}
