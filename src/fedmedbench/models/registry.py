"""Model registry: a config name maps to a constructor (no if/else chains).

``build_model(name, in_channels, num_classes, image_size)``. Names registered here
plus any timm model as ``timm:<name>``. Random init unless ``pretrained_path`` names a
weights file (a fetched weight set or the user's own state_dict): it is read without
running code and must fill every tensor but the head (fedmedbench.weights).
"""

from __future__ import annotations

from collections.abc import Callable

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

        kwargs = dict(pretrained=False, in_chans=in_channels, num_classes=num_classes)
        try:  # models with a fixed token grid (Swin, ViT) are built for the study's image size
            model = timm.create_model(name[5:], img_size=image_size, **kwargs)
        except TypeError as exc:
            if "img_size" not in str(exc):
                raise
            model = timm.create_model(name[5:], **kwargs)
    elif name in MODELS:
        model = MODELS[name](in_channels=in_channels, num_classes=num_classes, image_size=image_size)
    else:
        raise KeyError(f"unknown model '{name}'; registered: {sorted(MODELS)} or 'timm:<name>'")
    if pretrained_path:
        from fedmedbench.weights.models import load_state_file

        load_state_file(model, pretrained_path, "pretrained weights")
    return model

