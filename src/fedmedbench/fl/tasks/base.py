"""What a run learns: its data per client and how a model is evaluated.

The round logic (:mod:`fedmedbench.fl.engine.federation`) is task-independent; a
:class:`Task` supplies the client data a method's ``client_fit`` receives
(``ctx.data``), the training-set sizes that set step budgets and averaging weights,
and evaluation. Studies choose one with ``RunSpec.task`` (``classification`` for the
MedMNIST studies; the surgical studies register their own, e.g. detection with
Ultralytics' validator, part segmentation with Dice/HD95). The task modules register
themselves when first looked up (:func:`get_task_class`), so importing this registry
loads no task.

Metric rows follow one naming rule so tables and the progress log work for every
task: the server's evaluation of a global model returns ``global_<m>`` (held-out
test) and optionally ``val_<m>``; per-client numbers are ``local_<m>`` (the client's
own test split) plus any extra ``<prefix>_<m>`` columns a task documents (e.g.
cross-distribution ``cd_<m>``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fedmedbench.fl.spec import RunSpec

TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls
        return cls

    return deco


class Task:
    """Base class; one instance per process and run (see :func:`task_for`)."""

    name = "base"
    #: metric names m (without prefix) that every evaluation returns
    metric_names: tuple[str, ...] = ()
    #: the metric the summary's ``best_round`` is chosen by (higher is better)
    primary_metric: str = ""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec

    @classmethod
    def resolve_spec(cls, spec: RunSpec) -> RunSpec:
        """Fill in what is read from the data (input channels, classes) before the model is built."""
        return spec

    @property
    def num_clients(self) -> int:
        raise NotImplementedError

    def client_sizes(self) -> list[int]:
        """Training examples per client (step budgets, example-weighted averaging)."""
        raise NotImplementedError

    def client_data(self, pid: int) -> Any:
        """What ``ctx.data`` holds on client ``pid``."""
        raise NotImplementedError

    def pooled_data(self) -> Any:
        """The centralized baseline's one client: every client's data together."""
        raise NotImplementedError

    def evaluate_global(self, model: torch.nn.Module, device: torch.device) -> tuple[dict[str, float], list[dict[str, float]]]:
        """A global model on the server: (``global_*``/``val_*`` row, one ``local_*`` dict per client)."""
        raise NotImplementedError

    def set_eval_round(self, rnd: int) -> None:
        """The next :meth:`evaluate_global` is of round ``rnd`` (a task whose evaluation draws random
        numbers seeds them by it, so a resumed run evaluates alike); default: nothing to seed."""

    def evaluate_client(self, model: torch.nn.Module, data: Any, device: torch.device) -> dict[str, float]:
        """A personalized client's own model (``data`` = its :meth:`client_data`): ``local_*`` on
        its own test split and ``global_*`` on the held-out global test set."""
        raise NotImplementedError

    @classmethod
    def evaluate_validation(cls, model: torch.nn.Module, data: Any, device: torch.device, batch_size: int,
                            generator: torch.Generator | None = None) -> dict[str, float]:
        """A client's model on its own validation split (metric names without prefix; ``client_validation``).
        A class method: a deployed site has its own data but no partition to build the task from. ``generator``:
        the client's, for a task whose validation reads draw random numbers."""
        raise NotImplementedError(f"task '{cls.name}' has no client-side validation: set client_validation: null")


def get_task_class(name: str) -> type[Task]:
    _load_builtin_tasks(name)
    if name not in TASKS:
        raise KeyError(f"unknown task '{name}'; registered: {', '.join(sorted(TASKS))}")
    return TASKS[name]


@lru_cache(maxsize=4)
def _task_cached(name: str, spec_json: str) -> Task:
    from fedmedbench.fl.spec import RunSpec

    return get_task_class(name)(RunSpec.from_json(spec_json))


def task_for(spec: RunSpec) -> Task:
    """The run's task, built once per process (its data is loaded once, not per client call)."""
    return _task_cached(spec.task, spec.to_json())


#: the module whose import registers each built-in task
TASK_MODULE_OF: dict[str, str] = {
    "classification": "fedmedbench.fl.tasks.classification",
    "detection": "fedmedbench.fl.tasks.detection.task",
    "segmentation": "fedmedbench.fl.tasks.segmentation.task",
}
BUILTIN_TASK_MODULES: tuple[str, ...] = tuple(TASK_MODULE_OF.values())


def _load_builtin_tasks(name: str | None = None) -> None:
    """Import the module of task ``name`` only (a classification job loads neither Ultralytics nor
    MedPy); every built-in task module when ``name`` is None or not built in."""
    import importlib

    if name in TASKS:
        return
    for module in [TASK_MODULE_OF[name]] if name in TASK_MODULE_OF else BUILTIN_TASK_MODULES:
        importlib.import_module(module)
