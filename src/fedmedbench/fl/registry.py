"""Method registry: method name -> the :class:`~fedmedbench.fl.api.Method` class registered under it.

Adding a method = one file ``fl/methods/<name>.py`` whose class is decorated with
``@register_method("<name>")``. The built-in modules are the files of ``fl/methods`` (those whose
name does not start with ``_``). Methods register when first looked up, so importing this registry
(or one method file) loads no other method.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedmedbench.fl.api import Method

METHODS: dict[str, type[Method]] = {}

#: the package whose modules each register the method of their name
METHODS_PACKAGE = "fedmedbench.fl.methods"


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


def get_method(name: str, params: dict[str, Any] | None = None) -> Method:
    _load_builtin_methods(name)
    if name not in METHODS:
        raise KeyError(f"unknown method '{name}'; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name](**(params or {}))


def available_methods() -> list[str]:
    _load_builtin_methods()
    return sorted(METHODS)


def builtin_method_modules() -> tuple[str, ...]:
    """The modules whose import registers a built-in method: one per file of ``fl/methods``, named as
    the method it registers (files starting with ``_`` hold shared code)."""
    folder = Path(importlib.import_module(METHODS_PACKAGE).__file__).parent
    return tuple(f"{METHODS_PACKAGE}.{p.stem}" for p in sorted(folder.glob("*.py")) if not p.stem.startswith("_"))


def _load_builtin_methods(name: str | None = None) -> None:
    """Import the module that registers ``name`` (only it: a classification job never imports the
    surgical methods' libraries); every built-in method module when ``name`` is None or not built in."""
    if name in METHODS:
        return
    modules = builtin_method_modules()
    module = f"{METHODS_PACKAGE}.{name}"
    for m in [module] if module in modules else modules:
        importlib.import_module(m)
