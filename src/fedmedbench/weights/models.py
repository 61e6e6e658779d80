"""Put a weight file into a timm, Ultralytics or open_clip model, safely and completely.

No network and no code from the file: tensors are read by :mod:`fedmedbench.weights.safeload`
(YOLO checkpoints, which pickle a whole model, by Ultralytics' restricted
``weights_only=True`` loader). Heads are re-initialised for the task's class count (as
``timm.create_model(..., pretrained=True, num_classes=n)`` and Ultralytics' ``nc`` do);
every other tensor must load, else :class:`~fedmedbench.weights.safeload.WeightsError`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedmedbench.weights.safeload import LoadReport, WeightsError, load_backbone, read_tensors, unwrap


def _timm_filter(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's own checkpoint conversion for the architecture (original-repo layouts -> timm)."""
    fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if fn is None:
        return state
    try:
        return dict(fn(state, model))
    except Exception:  # a filter that does not apply to this layout leaves the tensors as they are
        return state


def _adapt_first_conv(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Grey-scale (or other) inputs: timm's rule for reusing RGB first-layer weights."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    first = cfg.get("first_conv")
    in_chans = getattr(model, "in_chans", None) or cfg.get("in_chans")
    names = [first] if isinstance(first, str) else list(first or [])
    own = model.state_dict()
    for name in names:
        key = f"{name}.weight"
        if key in state and key in own and state[key].shape[1] != own[key].shape[1]:
            from timm.models import adapt_input_conv

            state[key] = adapt_input_conv(own[key].shape[1] if in_chans is None else int(in_chans), state[key])
    return state


def load_timm(model: nn.Module, path: str | Path, what: str = "weights") -> LoadReport:
    """Load a timm-format file (safetensors or state_dict) into a timm ``model``."""
    state = unwrap(read_tensors(path, what), f"{path}")
    state = _adapt_first_conv(model, _timm_filter(model, state))
    return load_backbone(model, state, f"{path} ({what})")


def load_state_file(model: nn.Module, path: str | Path, what: str = "weights",
                    head: tuple[str, ...] | None = None) -> LoadReport:
    """Load any state_dict file (containers unwrapped) into ``model``; timm models get timm's conversions."""
    if hasattr(model, "pretrained_cfg"):
        return load_timm(model, path, what)
    state = unwrap(read_tensors(path, what), f"{path}")
    return load_backbone(model, state, f"{path} ({what})", head=head)


def yolo_head_prefixes(model: nn.Module) -> tuple[str, ...]:
    """The class branches of an Ultralytics detection head: their width depends on ``nc``
    (``c3 = max(ch, min(nc, 100))``), so for another class count they start fresh where the
    shapes differ, as Ultralytics' own transfer does; box branches and the body must load."""
    detect = model.model[-1]
    idx = len(model.model) - 1
    return tuple(f"model.{idx}.{attr}" for attr in ("cv3", "one2one_cv3") if getattr(detect, attr, None) is not None)


def read_yolo_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The fp32 state_dict of an Ultralytics ``.pt`` (EMA if present), read with ``weights_only=True``.

    Ultralytics pickles a whole ``DetectionModel``; its restricted loader rebuilds only the
    known Ultralytics/torch classes, so a file with any other global (a payload) is refused.
    A plain state_dict file is accepted as well.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: YOLO weights file not found; no download is attempted")
    if path.suffix != ".pt":
        return unwrap(read_tensors(path, "YOLO weights"), str(path))
    from ultralytics.nn.tasks import torch_safe_load

    try:
        ckpt, _ = torch_safe_load(str(path), safe_only=True)
    except (TypeError, ModuleNotFoundError, RuntimeError) as exc:
        raise WeightsError(f"{path}: refused or unreadable YOLO checkpoint (loaded with weights_only=True, "
                           f"known Ultralytics classes only): {str(exc).splitlines()[0]}") from exc
    obj: Any = ckpt.get("ema") or ckpt.get("model") if isinstance(ckpt, dict) else ckpt
    if isinstance(obj, nn.Module):
        return {k: (v.float() if v.is_floating_point() else v) for k, v in obj.state_dict().items()}
    return unwrap(ckpt, str(path))


def load_yolo(model: nn.Module, path: str | Path) -> LoadReport:
    """Load a YOLO checkpoint into a ``DetectionModel`` built for the task's ``nc``."""
    return load_backbone(model, read_yolo_checkpoint(path), f"{path} (YOLO weights)", head=yolo_head_prefixes(model))


def read_open_clip(path: str | Path) -> dict[str, torch.Tensor]:
    return unwrap(read_tensors(path, "open_clip weights"), str(path))


def load_open_clip(model: nn.Module, path: str | Path, state: dict[str, torch.Tensor] | None = None) -> LoadReport:
    """Load an open_clip state_dict (safetensors or torch) into ``model``: every tensor must fit."""
    state = read_open_clip(path) if state is None else state
    return load_backbone(model, state, f"{path} (open_clip weights)", head=())
