"""Models by config name: :func:`build_model` (``registry``) maps a name to a constructor; importing the
package registers the project's own networks (``cnn``, ``vae``, ``projection``) and FedST's (``fedst``) is built
through its own config block. Any timm model is ``timm:<name>``."""

from __future__ import annotations

from fedmedbench.models import cnn, gpaf_authors, moon_resnet, projection, swin_gpaf, vae  # noqa: F401  (registers their models)
from fedmedbench.models.registry import MODELS, build_model, register_model

__all__ = ["MODELS", "build_model", "register_model"]
