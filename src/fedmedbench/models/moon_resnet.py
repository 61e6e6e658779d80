"""The GPAF authors' MOON network: a small ResNet-18 base, MOON's projection head and a last layer.

sanywright13/update-gpaf ``ModelMOON`` (simulation/fedprox/fedprox/models.py at 7f48809, BreastMNIST; the same
``Model`` with 3 input channels at 016f860 fedprox/fedprox/models.py): the base ``ResNetBreastMNIST``
(BasicBlocks [2, 2, 2, 2], widths 32-64-128-256, a 3x3 stride-1 first convolution, no max-pool, Kaiming-normal
fan_out convolutions) without its last layer is ``features`` (h, 256-d after the average pool); then
l1 256 -> 256, ReLU, l2 256 -> out_dim (256, the authors' ``output_dim``) gives the projection that MOON
contrasts, and l3 out_dim -> classes the logits. 2,926,562 parameters at 1 channel, 2 classes.
Names are the authors' (``features.0`` ... ``features.6``, ``l1``, ``l2``, ``l3``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedmedbench.models.gpaf_authors import init_resnet, resnet_stages
from fedmedbench.models.projection import MOON_OUTPUT_DIM
from fedmedbench.models.registry import register_model


class MoonResNet(nn.Module):
    """h = features(x); z = l2(relu(l1(h))) (``embed``); logits = l3(z) (``classifier`` is l3)."""

    def __init__(self, in_channels: int, num_classes: int, out_dim: int = MOON_OUTPUT_DIM,
                 widths: tuple[int, ...] = (32, 64, 128, 256)):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True), *resnet_stages(widths[0], widths, (2, 2, 2, 2)), nn.AdaptiveAvgPool2d((1, 1)),
        )
        init_resnet(self.features)
        self.l1 = nn.Linear(widths[-1], widths[-1])
        self.l2 = nn.Linear(widths[-1], out_dim)
        self.l3 = nn.Linear(out_dim, num_classes)

    @property
    def classifier(self) -> nn.Module:
        """The last layer (what MOON's loss reads the logits from)."""
        return self.l3

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The projection z that MOON contrasts and the last layer reads."""
        h = torch.flatten(self.features(x), 1)
        return self.l2(F.relu(self.l1(h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(self.embed(x))


@register_model("moon_resnet_gpaf")
def moon_resnet_gpaf(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return MoonResNet(in_channels, num_classes)


@register_model("moon_resnet_gpaf_tiny")
def moon_resnet_gpaf_tiny(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """Stages 8-16-32-64 wide, the same head (the demo's, for a quick run on a CPU)."""
    return MoonResNet(in_channels, num_classes, widths=(8, 16, 32, 64))
