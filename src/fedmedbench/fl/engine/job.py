"""One training job resolved once: its spec, method, task, device and the models it reuses.

The server (:class:`~fedmedbench.fl.engine.federation.Federation`) and the client functions get a
:class:`Job` instead of looking the method and task up from the spec at every step. It also
owns what a job reuses across client calls:

* one resident model: when the method shares the whole state_dict, the broadcast overwrites
  every entry, so each client call loads the arrays into the same model in place (no deep copy
  or rebuild per call; its ``requires_grad`` flags, train/eval modes and gradients are reset to a
  freshly built model's, so what a method changed in one call never reaches the next). A method
  that keeps un-shared entries gets a freshly built model per call, as before.
* client data on the device (``cache_on_device``, accelerators only): each client's tensors are
  copied to the device once per job while they fit in half of the device memory free at the
  first copy; the rest stays on the host and is moved per batch.
* where the model's arrays live (``array_device``): on the inline backend (server and clients in
  one process) with an accelerator, the global model, the client results and the average stay
  tensors on the device; nothing goes through the host per client. Elsewhere (CPU, Ray actors, a
  deployed site) they are CPU tensors.
* the client-state store (``state_store``): deferred on the inline backend, where the server's
  checkpoint writes the states the round's clients saved (see ``client_state``).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from functools import lru_cache
from typing import Any

import torch

from fedmedbench.fl.api.arrays import load_arrays, moved
from fedmedbench.fl.api.method import Arrays, ClientData, Method, TrainConfig
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.determinism import use_deterministic_kernels
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state.checkpoint import client_store
from fedmedbench.fl.state.slots import StateSlots
from fedmedbench.fl.tasks.base import Task, task_for
from fedmedbench.fl.training import to_device

#: share of the device memory free at the first copy that cached client data may use
DEVICE_DATA_SHARE = 0.5
#: devices whose client data is worth caching (on the CPU the data already is where it is used)
CACHED_DEVICE_TYPES = ("cuda",)
#: devices on which an in-process job keeps its arrays (elsewhere they are CPU tensors)
ARRAY_DEVICE_TYPES = ("cuda",)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but no CUDA device is available (use device: auto or cpu)")
    return torch.device(name)


def check_method_file(spec: RunSpec) -> None:
    """A user's method file must be the one the run was planned with (its hash is in the run hash)."""
    if spec.method_file is not None and spec.method_sha256 is not None:
        from fedmedbench.workflow.io import file_digest

        if file_digest(spec.method_file) != spec.method_sha256:
            raise RuntimeError(f"method '{spec.method}': {spec.method_file} changed after this run was planned; "
                               "run the workflow again so the run is planned (and hashed) with the new file")


class Job:
    """A run's spec with its method, task, device and train config resolved once."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        check_method_file(spec)
        self.method: Method = get_method(spec.method, spec.method_params, spec.method_file)
        self._task: Task | None = None
        self.device = resolve_device(spec.device)
        if spec.deterministic:
            use_deterministic_kernels()
        self.train: TrainConfig = TrainConfig.from_spec(spec)
        self._resident: torch.nn.Module | None = None
        self._fresh_flags: tuple[list, list] | None = None
        self._shared_keys: list[str] | None = None
        self._whole: bool | None = None
        #: where the resident model keeps its state (read and written without walking its modules)
        self._slots: StateSlots | None = None
        self._data: dict[int, Any] = {}
        self._data_bytes = 0
        self._data_budget: int | None = None
        #: where arrays between server and clients live (set by the engine: see :meth:`place_arrays`)
        self.array_device = torch.device("cpu")
        #: the clients' persistent states (``checkpoint/clients``); the engine defers its writes in-process
        self.state_store = client_store(spec.run_dir)

    @property
    def task(self) -> Task:
        """The run's task, built on first use (a deployed site has no partition to build it from)."""
        if self._task is None:
            self._task = task_for(self.spec)
        return self._task

    # -- models -----------------------------------------------------------------------
    def new_model(self) -> torch.nn.Module:
        return self.method.build_model(self.spec)

    def shared_keys(self) -> list[str]:
        if self._shared_keys is None:
            self._resident = self.new_model()
            self._shared_keys = self.method.shared_keys(self._resident)
            self._whole = set(self._shared_keys) == set(self._resident.state_dict())
            self._fresh_flags = ([(p, p.requires_grad) for p in self._resident.parameters()],
                                 [(m, m.training) for m in self._resident.modules()])
            self._slots = StateSlots.of(self._resident) if self._whole else None
        return self._shared_keys

    @property
    def resident(self) -> torch.nn.Module:
        """The model the job reuses for its client calls (built on first use)."""
        self.shared_keys()
        return self._resident

    @property
    def slots(self) -> StateSlots | None:
        """The resident model's state slots (None without a resident model, or where its state_dict
        is not plain parameters and buffers)."""
        self.shared_keys()
        return self._slots

    def place_arrays(self, in_process: bool) -> bool:
        """Keep the arrays on the job's device where server and clients share this process (``in_process``)
        and the device is one of :data:`ARRAY_DEVICE_TYPES`, else on the CPU; True in the first case."""
        on_device = bool(in_process and self.device.type in ARRAY_DEVICE_TYPES)
        self.array_device = self.device if on_device else torch.device("cpu")
        return on_device

    def arrays(self, arrays: Arrays) -> Arrays:
        """``arrays`` where this job keeps them (``array_device``; those already there are not copied)."""
        return moved(arrays, self.array_device)

    def model_with(self, arrays: Arrays) -> torch.nn.Module:
        """A model holding the broadcast ``arrays``, on the job's device."""
        keys = self.shared_keys()
        if self._whole:  # the resident model: values copied into its tensors in place
            model, slots = self._resident, self._slots
            self._reset(model)
            if slots is None:
                to_device(model, self.device)
                copy_into(model, arrays, keys)
            else:
                if not slots.on(self.device):
                    model.to(self.device)
                copy_into(model, arrays, keys, slots.tensors(keys))
            return model
        model = self.new_model()  # un-shared entries keep a freshly built model's values
        load_arrays(model, arrays, keys)
        return model.to(self.device)

    def _reset(self, model: torch.nn.Module) -> None:
        """Gradients dropped, ``requires_grad`` and train/eval modes as built; only what differs is written
        (``Module.__setattr__`` and ``requires_grad_`` cost far more than reading the flags)."""
        params, modules = self._fresh_flags
        for p, flag in params:
            if p.grad is not None:
                p.grad = None
            if p.requires_grad != flag:
                p.requires_grad_(flag)
        for m, training in modules:
            if m.training != training:
                m.training = training

    # -- data -------------------------------------------------------------------------
    def client_data(self, pid: int) -> Any:
        """A client's data (the pooled data for a centralized method); on the device when cached."""
        if pid in self._data:
            return self._data[pid]
        data = self.task.pooled_data() if self.method.centralized else self.task.client_data(pid)
        if self._caches_data(data):
            tensors = {f.name: getattr(data, f.name) for f in fields(data) if getattr(data, f.name) is not None}
            nbytes = sum(t.nbytes for t in tensors.values())
            if self._data_budget is None:
                self._data_budget = int(free_device_memory(self.device) * DEVICE_DATA_SHARE)
            if self._data_bytes + nbytes <= self._data_budget:
                data = replace(data, **{name: t.to(self.device) for name, t in tensors.items()})
                self._data_bytes += nbytes
                self._data[pid] = data
        return data

    def _caches_data(self, data: Any) -> bool:
        return (self.spec.cache_on_device and self.device.type in CACHED_DEVICE_TYPES and self.method.device_data
                and is_dataclass(data) and isinstance(data, ClientData))


def copy_into(model: torch.nn.Module, arrays: Arrays, keys: list[str], targets: list[torch.Tensor] | None = None) -> None:
    """Copy ``arrays[k]`` (tensors on any device) into the model's own tensors for ``keys``
    (the resident model's whole state): the values ``load_state_dict`` would set, by one grouped
    copy when the arrays are of the model's devices and dtypes. ``targets``: the model's
    tensors for ``keys`` when already at hand (its ``StateSlots``), else read from its state_dict."""
    missing = set(keys) - set(arrays)
    if missing:
        raise KeyError(f"arrays lack model keys: {sorted(missing)[:5]}")
    if targets is None:
        state = model.state_dict()
        targets = [state[k] for k in keys]
    sources = [torch.as_tensor(arrays[k]) for k in keys]
    for k, t, s in zip(keys, targets, sources, strict=True):
        if tuple(s.shape) != tuple(t.shape):
            raise ValueError(f"array '{k}' has shape {tuple(s.shape)}, the model expects {tuple(t.shape)}")
    with torch.no_grad():
        if all(s.device == t.device and s.dtype == t.dtype for s, t in zip(sources, targets, strict=True)):
            torch._foreach_copy_(targets, sources)
        else:
            for t, s in zip(targets, sources, strict=True):
                t.copy_(s)


def free_device_memory(device: torch.device) -> int:
    """Bytes free on an accelerator (0 where unknown, which turns caching off)."""
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return 0


@lru_cache(maxsize=2)
def _job_cached(spec_json: str) -> Job:
    return Job(RunSpec.from_json(spec_json))


def job_for(spec: RunSpec) -> Job:
    """The job of ``spec`` in this process (a Ray actor resolves it once and reuses it)."""
    return _job_cached(spec.to_json())
