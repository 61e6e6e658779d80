"""The method registry: one class per name, one method per file of ``fl/methods`` named as it."""

from __future__ import annotations

import importlib.util

import pytest

from fedmedbench.fl.api import Method, registry
from fedmedbench.fl.api.registry import (
    DuplicateMethodError,
    available_methods,
    builtin_method_modules,
    register_method,
)


def test_a_name_taken_by_another_class_is_an_error_naming_both(monkeypatch):
    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))

    @register_method("twice")
    class First(Method):
        pass

    class Second(Method):
        pass

    with pytest.raises(DuplicateMethodError) as err:
        register_method("twice")(Second)
    msg = str(err.value)
    assert "'twice'" in msg and f"{__name__}.test_a_name_taken_by_another_class_is_an_error_naming_both.<locals>.First" in msg
    assert msg.endswith("<locals>.Second")
    assert registry.METHODS["twice"] is First and Second.name == "base"  # the refused class is left as it was


def test_importing_a_method_module_again_registers_it_again(monkeypatch):
    """A second execution of one module (a reload) defines an equal class: it replaces the first."""
    available_methods()
    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
    spec = importlib.util.find_spec("fedmedbench.fl.methods.fedprox")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert registry.METHODS["fedprox"] is module.FedProx


def test_each_method_module_registers_exactly_the_method_of_its_name():
    modules = builtin_method_modules()
    names = available_methods()
    assert {m.rsplit(".", 1)[1] for m in modules} == set(names)
    for name in names:
        assert registry.METHODS[name].__module__ == f"fedmedbench.fl.methods.{name}", name
    assert "fedmedbench.fl.methods._seg_shared" not in modules and "fedmedbench.fl.methods._sgd" not in modules
    assert {"seg_local", "seg_centralized", "seg_fedavg", "fedavg", "fedst"} <= set(names)
