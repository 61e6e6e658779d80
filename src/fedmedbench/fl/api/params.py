"""A method's hyper-parameters, declared once next to its class: ``params = (Param("mu", float, 0.1, low=0), ...)``.

The declarations are the one source of each parameter's name, type, default, bounds and meaning: the
method reads its values from them (``Method.p``), the workflow checks a config's ``method_params``
against them while it plans (:mod:`fedmedbench.fl.api.method_source` reads them without importing torch),
and the schema's ``method_params`` blocks are made from them (:func:`json_schema`, kept equal by a test).
Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: the types a parameter may have, by the name its declaration uses
TYPES: dict[str, type] = {"float": float, "int": int, "str": str, "bool": bool, "list": list, "dict": dict}
_JSON_TYPES = {float: "number", int: "integer", str: "string", bool: "boolean", list: "array", dict: "object"}


class UnknownParameterError(TypeError):
    """A ``method_params`` key that the method does not declare."""


@dataclass(frozen=True)
class Param:
    """One hyper-parameter: ``value`` of ``type`` within [low, high] (open ends with ``low_open``/``high_open``),
    one of ``choices`` when given; ``nullable`` admits None; ``also`` lists values taken as they are (resolved
    before the run, e.g. GPAF's ``label_alpha: partition``)."""

    name: str
    type: type
    default: Any
    doc: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    nullable: bool = False
    also: tuple = ()

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid value of this parameter (None when it is)."""
        if value in self.also and not isinstance(value, bool):
            return None
        if value is None:
            return None if self.nullable or (self.choices and None in self.choices) else "must not be null"
        if not _has_type(value, self.type):
            extra = f" or one of {list(self.also)}" if self.also else ""
            return f"must be of type {_JSON_TYPES[self.type]}{extra}, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"{value!r}: choose one of {list(self.choices)}"
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return f"must be {'>' if self.low_open else '>='} {self.low}, got {value!r}"
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return f"must be {'<' if self.high_open else '<='} {self.high}, got {value!r}"
        return None


def _has_type(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)


def merged(declarations: Iterable[Iterable[Param]]) -> dict[str, Param]:
    """Name -> parameter, later declarations (a subclass's) replacing earlier ones (a base class's)."""
    out: dict[str, Param] = {}
    for group in declarations:
        for p in group:
            out[p.name] = p
    return out


def problems(method: str, declared: Mapping[str, Param], given: Mapping[str, Any], key: str) -> list[tuple[str, str]]:
    """(key path, message) for every unknown or invalid entry of ``given`` (the config's ``key`` block)."""
    out = []
    for name, value in given.items():
        if name not in declared:
            out.append((f"{key}.{name}", f"unknown parameter of method {method}; known: {', '.join(sorted(declared)) or 'none'}"))
        elif (why := declared[name].problem(value)) is not None:
            out.append((f"{key}.{name}", why))
    return out


def resolve(method: str, declared: Mapping[str, Param], given: Mapping[str, Any]) -> dict[str, Any]:
    """The declared defaults with ``given`` on top; the first unknown key (TypeError) or invalid value
    (ValueError) fails naming ``method_params.<method>.<key>``."""
    for path, message in problems(method, declared, given, f"method_params.{method}"):
        name = path.rsplit(".", 1)[-1]
        raise (UnknownParameterError if name not in declared else ValueError)(f"{path}: {message}")
    return {**{n: p.default for n, p in declared.items()}, **given}


def json_schema(declared: Mapping[str, Param]) -> dict[str, Any]:
    """The schema block of one method's ``method_params`` (no defaults: those are the declarations')."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if declared:
        out["properties"] = {name: _param_schema(p) for name, p in declared.items()}
    return out


def _param_schema(p: Param) -> dict[str, Any]:
    kind = _JSON_TYPES[p.type]
    s: dict[str, Any] = {"type": [kind, "null"] if p.nullable else kind}
    if p.choices is not None:
        s["enum"] = list(p.choices)
        if None in p.choices:
            s["type"] = [kind, "null"]
    if p.low is not None:
        s["exclusiveMinimum" if p.low_open else "minimum"] = p.low
    if p.high is not None:
        s["exclusiveMaximum" if p.high_open else "maximum"] = p.high
    if p.also:
        s = {"anyOf": [s, {"enum": list(p.also)}]}
    if p.doc:
        s["description"] = p.doc
    return s
