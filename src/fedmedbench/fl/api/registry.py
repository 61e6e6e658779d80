"""Method registry: method name -> the :class:`~fedmedbench.fl.api.method.Method` class registered under it.

Adding a method = one file whose class is decorated with ``@register_method("<name>")`` and declares
its hyper-parameters (``params``): a built-in one as ``fl/methods/<name>.py`` (the files of
``fl/methods`` whose name does not start with ``_``), a user's anywhere, named in the config's
``methods`` (:func:`load_method_file`) or by an entry point of group ``fedmedbench.methods``.
Methods register when first looked up, so importing this registry (or one method file) loads no
other method.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedmedbench.fl.api.method import Method
from fedmedbench.fl.api.method_errors import add_note
from fedmedbench.fl.api.method_source import (
    ENTRY_POINT_GROUP,
    METHODS_PACKAGE,
    builtin_method_modules,
    registered_in,
)

METHODS: dict[str, type[Method]] = {}
#: the module name a user's method file is imported under (one per method name)
USER_MODULE_PREFIX = "fedmedbench_user_methods."


class DuplicateMethodError(ValueError):
    """Two different classes registered under one method name."""


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: ``name`` looks up the class. A second class under a taken name is an error;
    the same class again (its module imported a second time, e.g. reloaded) replaces the first."""

    def deco(cls: type[Method]) -> type[Method]:
        old = METHODS.get(name)
        if old is not None and _qualname(old) != _qualname(cls):
            raise DuplicateMethodError(f"method '{name}' is registered twice: by {_qualname(old)} and by {_qualname(cls)}")
        cls.name = name
        METHODS[name] = cls
        return cls

    return deco


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def get_method(name: str, params: dict[str, Any] | None = None, path: str | None = None) -> Method:
    """A ``name`` method with ``params``; ``path`` = the user's file that registers it (config ``methods``)."""
    if path is not None:
        load_method_file(name, path)
    _load_builtin_methods(name)
    if name not in METHODS:
        raise KeyError(f"unknown method '{name}'; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name](**(params or {}))


def available_methods() -> list[str]:
    _load_builtin_methods()
    return sorted(METHODS)


def load_method_file(name: str, path: str | Path) -> type[Method]:
    """Import the user's file at ``path``, which must register ``name``; a built-in of that name is an error
    naming both (the built-in is registered first, so the duplicate check sees it). An error raised while the
    file runs keeps its type and carries a note naming the method and the line (``method_errors``)."""
    path = Path(path).resolve()
    module_name = USER_MODULE_PREFIX + name
    loaded = sys.modules.get(module_name)
    if loaded is not None and Path(loaded.__file__).resolve() == path and name in METHODS:
        return METHODS[name]
    if name not in registered_in(path):
        raise ValueError(f"{path} registers no method '{name}' (a class decorated with @register_method({name!r}))")
    _load_builtin_methods(name)
    if name in METHODS and METHODS[name].__module__ != module_name:
        raise DuplicateMethodError(f"method '{name}' of {path} is already registered by {_qualname(METHODS[name])}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        add_note(exc, name, [path], "while its file was imported")
        raise
    return METHODS[name]


def _load_builtin_methods(name: str | None = None) -> None:
    """Import the module that registers ``name`` (only it: a classification job never imports the
    surgical methods' libraries); every built-in method module when ``name`` is None or not built in."""
    if name in METHODS:
        return
    modules = builtin_method_modules()
    module = f"{METHODS_PACKAGE}.{name}"
    for m in [module] if module in modules else modules:
        importlib.import_module(m)
    if module not in modules:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if name is None or ep.name == name:
                ep.load()
