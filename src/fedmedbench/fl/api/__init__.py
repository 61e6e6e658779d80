"""The method API: everything a method file imports, from this one path.

``from fedmedbench.fl.api import Method, Param, register_method, ClientContext, ServerContext, ClientResult``.
The names live in ``method`` (the :class:`Method` base class, its contexts and results), ``params``
(:class:`Param`, one hyper-parameter's declaration), ``arrays`` (model arrays: taken, loaded, averaged) and
``registry`` (method names -> classes); ``method_errors`` notes where a method raised; ``method_source`` and ``method_params`` read the declarations without
importing torch, for the workflow while it plans. Importing the package loads none of them: each name is
imported when first used, so planning stays torch-free.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: public name -> the module of this package that defines it
_WHERE = {
    **dict.fromkeys(["ClientContext", "ClientData", "ClientResult", "Method", "ServerContext", "TrainConfig",
                     "Trainer"], "method"),
    "Param": "params",
    **dict.fromkeys(["Arrays", "load_arrays", "model_tensors", "snapshot", "weighted_average"], "arrays"),
    **dict.fromkeys(["available_methods", "get_method", "register_method"], "registry"),
}
__all__ = ["Arrays", "ClientContext", "ClientData", "ClientResult", "Method", "Param", "ServerContext", "TrainConfig",
           "Trainer", "available_methods", "get_method", "load_arrays", "model_tensors", "register_method", "snapshot",
           "weighted_average"]
assert sorted(__all__) == sorted(_WHERE)

if TYPE_CHECKING:
    from fedmedbench.fl.api.arrays import Arrays, load_arrays, model_tensors, snapshot, weighted_average
    from fedmedbench.fl.api.method import (
        ClientContext,
        ClientData,
        ClientResult,
        Method,
        ServerContext,
        TrainConfig,
        Trainer,
    )
    from fedmedbench.fl.api.params import Param
    from fedmedbench.fl.api.registry import available_methods, get_method, register_method


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
