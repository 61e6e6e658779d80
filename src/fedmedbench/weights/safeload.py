"""Reading weight files without running code, and loading them without silent gaps.

A ``.pt``/``.pth``/``.bin`` file is a pickle: unpickling it with ``weights_only=False`` can
run arbitrary code. Every weight file the project reads goes through :func:`read_tensors`
(``torch.load(weights_only=True)`` or safetensors), so a crafted file is refused before
anything in it runs.

:func:`load_backbone` then puts the tensors into a model and insists that every tensor of
the model outside its head is loaded: a file nested in ``{'state_dict': ...}`` or saved
from ``DataParallel`` (``module.`` prefixes) is unwrapped first, and whatever still does
not fit is an error naming the missing and unexpected keys, never a model quietly left
at random init.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


class WeightsError(ValueError):
    """A weight file that cannot be used (unsafe, unreadable, or not fitting the model)."""


#: container keys under which checkpoints commonly nest their tensors (first match wins)
CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "params")
#: prefixes left by wrappers (DataParallel / DDP, torch.compile)
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def read_tensors(path: str | Path, what: str = "weights") -> Any:
    """The object stored in ``path``, read without executing code.

    ``.safetensors`` files are read by safetensors; anything else by
    ``torch.load(weights_only=True)``, which refuses pickled objects other than tensors
    and plain containers (a pickle-bomb is refused here, before its payload runs).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} file not found")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"{path}: not a readable safetensors file ({what}): {exc}") from exc
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise WeightsError(
            f"{path}: refused ({what}): not a plain weights file: it holds pickled objects other than tensors, "
            f"which could run code when loaded. Only plain state_dicts (tensors in dicts/lists) or safetensors "
            f"files are accepted{_refusal_detail(exc)}") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise WeightsError(f"{path}: not a readable PyTorch weights file ({what}): {str(exc).splitlines()[0]}") from exc


def _refusal_detail(exc: Exception) -> str:
    """What torch found in the pickle (its "unsupported GLOBAL" line), without torch's advice to load the
    file with ``weights_only=False``, which would run that code."""
    lines = [line.strip() for line in str(exc).splitlines() if "GLOBAL" in line or "Unsupported" in line]
    return f". Detail: {lines[0]}" if lines else ""


def _is_tensor_map(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def unwrap(obj: Any, source: str = "weights") -> dict[str, torch.Tensor]:
    """The flat ``name -> tensor`` mapping inside a checkpoint.

    Descends through the usual containers (``state_dict``, ``model``, ... ; nested
    ones too), then strips ``module.``/``_orig_mod.`` prefixes shared by every key.
    """
    seen = 0
    while isinstance(obj, Mapping) and not _is_tensor_map(obj) and seen < 4:
        inner = next((obj[k] for k in CONTAINER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj, seen = inner, seen + 1
    if not isinstance(obj, Mapping):
        raise WeightsError(f"{source}: holds a {type(obj).__name__}, not a state_dict (name -> tensor mapping)")
    state = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise WeightsError(f"{source}: no tensors found (top-level keys: {sorted(map(str, obj))[:8]})")
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
                changed = True
    return state


def head_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Module names of the model's task head (re-initialised for the task's class count).

    timm models name it in ``pretrained_cfg['classifier']``; a model may declare
    ``head_prefixes``; otherwise the last ``nn.Linear`` is taken as the head.
    """
    declared = getattr(model, "head_prefixes", None)
    if declared:
        return tuple(declared)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    classifier = cfg.get("classifier") if isinstance(cfg, Mapping) else None
    if classifier:
        return (classifier,) if isinstance(classifier, str) else tuple(classifier)
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return (linears[-1],) if linears else ()


def _in(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


@dataclass
class LoadReport:
    """What :func:`load_backbone` did: loaded keys and head keys left at their initialisation."""

    loaded: list[str] = field(default_factory=list)
    head_reinitialised: list[str] = field(default_factory=list)


#: bookkeeping buffers that may be absent from a file without changing any weight
_OPTIONAL = ("num_batches_tracked",)


def load_backbone(model: nn.Module, state: Mapping[str, torch.Tensor], source: str,
                  head: Iterable[str] | None = None) -> LoadReport:
    """Load ``state`` into ``model``: every non-head tensor must be present with its shape.

    Head tensors are loaded when their shapes fit (same class count) and otherwise keep the
    model's fresh initialisation (listed in the report). Anything else that is missing, of
    another shape, or left over in the file is a :class:`WeightsError` naming the keys.
    """
    head = tuple(head_prefixes(model) if head is None else head)
    own = model.state_dict()
    take: dict[str, torch.Tensor] = {}
    report = LoadReport()
    missing, shape_bad = [], []
    for key, target in own.items():
        value = state.get(key)
        if _in(key, head):
            if value is not None and tuple(value.shape) == tuple(target.shape):
                take[key] = value
            else:
                report.head_reinitialised.append(key)
        elif value is None:
            if not key.endswith(_OPTIONAL):
                missing.append(key)
        elif tuple(value.shape) != tuple(target.shape):
            shape_bad.append(f"{key} {tuple(value.shape)} vs model {tuple(target.shape)}")
        else:
            take[key] = value
    unexpected = [k for k in state if k not in own and not _in(k, head)]
    if missing or shape_bad or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[:5]})")
        if shape_bad:
            parts.append(f"{len(shape_bad)} of another shape (e.g. {shape_bad[:3]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[:5]})")
        raise WeightsError(f"{source}: does not fit {type(model).__name__} (head {list(head)} excepted): "
                           + "; ".join(parts))
    model.load_state_dict(take, strict=False)
    report.loaded = sorted(take)
    return report
