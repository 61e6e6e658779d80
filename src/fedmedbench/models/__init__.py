"""Model registry: a config name maps to a constructor (no if/else chains).

``build_model(name, in_channels, num_classes, image_size)``. Names registered here
plus any timm model as ``timm:<name>`` (random init offline; a local weights file
can be given with ``pretrained_path``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str):
    def deco(fn):
        MODELS[name] = fn
        return fn

    return deco


def build_model(name: str, in_channels: int, num_classes: int, image_size: int, pretrained_path: str | None = None) -> nn.Module:
    if name.startswith("timm:"):
        import timm

        model = timm.create_model(name[5:], pretrained=False, in_chans=in_channels, num_classes=num_classes)
    elif name in MODELS:
        model = MODELS[name](in_channels=in_channels, num_classes=num_classes, image_size=image_size)
    else:
        raise KeyError(f"unknown model '{name}'; registered: {sorted(MODELS)} or 'timm:<name>'")
    if pretrained_path:
        path = Path(pretrained_path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: pretrained weights file not found (model.pretrained_path)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if k in model.state_dict() and v.shape == model.state_dict()[k].shape}
        model.load_state_dict(state, strict=False)
    return model


from fedmedbench.models import cnn, vae  # noqa: E402,F401  (registers their models)
