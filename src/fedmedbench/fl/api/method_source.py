"""Methods and their declared parameters read from the method files' source text, without importing them.

The workflow plans without torch: it learns which names a file registers (``@register_method("x")``)
and the parameters the class declares (``params = (Param(...), ...)``, with its base classes', as
``Method.declared_params`` merges them at run time) from the file's syntax tree. A test keeps this
reading equal to the imported classes' for every registered method.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fedmedbench.fl.api.params import TYPES, Param, merged

#: the package whose modules each register the method of their name
METHODS_PACKAGE = "fedmedbench.fl.methods"
#: the entry-point group through which an installed package adds methods (name = the method's name)
ENTRY_POINT_GROUP = "fedmedbench.methods"


@dataclass(frozen=True)
class MethodSource:
    """Where a method is defined: its file, the class registered there, and the file's content hash."""

    name: str
    path: Path
    class_name: str

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def params(self) -> dict[str, Param]:
        return class_params(str(self.path), self.class_name)

    def centralized(self) -> bool:
        """``Method.centralized`` as the class (or a base) sets it: trained on the pooled data of all clients."""
        return bool(class_attribute(str(self.path), self.class_name, "centralized"))


def builtin_method_modules() -> tuple[str, ...]:
    """The modules whose import registers a built-in method: one per file of ``fl/methods``, named as
    the method it registers (files starting with ``_`` hold shared code)."""
    folder = _module_file(METHODS_PACKAGE).parent
    return tuple(f"{METHODS_PACKAGE}.{p.stem}" for p in sorted(folder.glob("*.py")) if not p.stem.startswith("_"))


def builtin_sources() -> dict[str, MethodSource]:
    """Built-in method name -> its source, read from the files of ``fl/methods``."""
    out: dict[str, MethodSource] = {}
    for module in builtin_method_modules():
        out.update(registered_in(_module_file(module)))
    return out


def registered_in(path: str | Path) -> dict[str, MethodSource]:
    """Method name -> source for every ``@register_method("name")`` class of the file at ``path``."""
    path = Path(path).resolve()
    out = {}
    for node in _tree(str(path)).body:
        if isinstance(node, ast.ClassDef):
            for deco in node.decorator_list:
                name = _registered_name(deco)
                if name is not None:
                    out[name] = MethodSource(name, path, node.name)
    return out


def _registered_name(deco: ast.expr) -> str | None:
    if not (isinstance(deco, ast.Call) and deco.args and isinstance(deco.args[0], ast.Constant)):
        return None
    func = deco.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return deco.args[0].value if called == "register_method" and isinstance(deco.args[0].value, str) else None


def entry_point_sources() -> dict[str, MethodSource]:
    """Methods of installed packages (entry points of group ``fedmedbench.methods``: name = module or module:Class)."""
    from importlib.metadata import entry_points

    out = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        module = ep.value.split(":")[0]
        found = registered_in(_module_file(module))
        if ep.name in found:
            out[ep.name] = found[ep.name]
    return out


@cache
def _tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def _module_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named '{module}'")
    return Path(spec.origin)


def class_params(path: str, class_name: str) -> dict[str, Param]:
    """The parameters class ``class_name`` of file ``path`` declares, its bases' first (as the MRO, base last)."""
    cls = _find_class(path, class_name)
    if cls is None:
        return {}
    groups = [class_params(*where) for base in reversed(cls.bases) if (where := _locate(path, base)) is not None]
    return merged([*(g.values() for g in groups), _own_params(path, cls)])


def class_attribute(path: str, class_name: str, name: str):
    """The literal value class ``class_name`` of file ``path`` (or its nearest base that sets it) gives ``name``;
    None where none sets it."""
    cls = _find_class(path, class_name)
    if cls is None:
        return None
    for node in cls.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and getattr(node, "value", None) is not None:
            return _value(path, node.value)
    for base in cls.bases:
        where = _locate(path, base)
        if where is not None and (value := class_attribute(*where, name)) is not None:
            return value
    return None


def _find_class(path: str, name: str) -> ast.ClassDef | None:
    return next((n for n in _tree(path).body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _locate(path: str, expr: ast.expr) -> tuple[str, str] | None:
    """(file, class name) a base-class or constant name of file ``path`` refers to; None when not found
    (a class outside Python files, or one that declares nothing)."""
    if not isinstance(expr, ast.Name):
        return None
    if _find_class(path, expr.id) is not None or _constant(path, expr.id) is not None:
        return path, expr.id
    for node in _tree(path).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == expr.id:
                    try:
                        return str(_module_file(node.module)), alias.name
                    except (ModuleNotFoundError, ValueError):
                        return None
    return None


def _constant(path: str, name: str) -> ast.expr | None:
    for node in _tree(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return node.value
    return None


def _own_params(path: str, cls: ast.ClassDef) -> list[Param]:
    for node in cls.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "params" and getattr(node, "value", None) is not None:
            value = node.value
            if not isinstance(value, (ast.Tuple, ast.List)):
                raise ValueError(f"{path}: {cls.name}.params must be a tuple of Param(...) declarations")
            return [_param(path, call) for call in value.elts]
    return []


def _param(path: str, call: ast.expr) -> Param:
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Param"):
        raise ValueError(f"{path}:{getattr(call, 'lineno', '?')}: a params entry must be Param(...)")
    args = [_value(path, a) for a in call.args]
    kwargs = {k.arg: _value(path, k.value) for k in call.keywords}
    return Param(*args, **kwargs)


def _value(path: str, node: ast.expr):
    """A literal, a type name (float, int, ...) or a constant of this or an imported module."""
    if isinstance(node, ast.Name):
        if node.id in TYPES:
            return TYPES[node.id]
        where = _locate(path, node)
        const = _constant(*where) if where is not None else None
        if const is None:
            raise ValueError(f"{path}:{node.lineno}: '{node.id}' in a Param declaration is not a literal constant")
        return _value(where[0], const)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(path, e) for e in node.elts) if isinstance(node, ast.Tuple) else [_value(path, e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(path, k): _value(path, v) for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)
