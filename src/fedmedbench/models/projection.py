"""MOON's projection head (Li, He, Song, CVPR 2021) on the paper's GPAF encoder (study ``gpaf_pathmnist``).

MOON's network (QinbinLi/MOON model.py ``ModelFedCon``) puts a two-layer projection MLP between the
feature extractor and the last layer: h = features(x), z = l2(relu(l1(h))) with l1: d -> d and
l2: d -> out_dim, logits = l3(z). The contrastive loss compares z, and the classifier reads z.
The GPAF authors' MOON runs set ``output_dim: 256`` (sanywright13/update-gpaf
fedprox/fedprox/conf/config.yaml). ``gpaf_cnn_moon`` is that head on the paper's VAE encoder (posterior mean,
d = 64), so MOON trains the feature extractor of the other methods of ``gpaf_pathmnist``; the authors' own MOON
network (a ResNet base) is ``moon_resnet_gpaf`` (``models/moon_resnet.py``, study ``gpaf``).
"""

from __future__ import annotations

import torch
from torch import nn

from fedmedbench.models.registry import register_model
from fedmedbench.models.vae import LATENT_DIM, ConvEncoder

#: the projection's output size in the GPAF authors' MOON configuration
MOON_OUTPUT_DIM = 256


class ProjectedEncoder(nn.Module):
    """Encoder -> projection MLP (l1, ReLU, l2) -> linear classifier; ``embed`` is the projection's output."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, latent_dim: int = LATENT_DIM,
                 out_dim: int = MOON_OUTPUT_DIM):
        super().__init__()
        self.encoder = ConvEncoder(in_channels, image_size, latent_dim)
        self.projection = nn.Sequential(nn.Linear(latent_dim, latent_dim), nn.ReLU(), nn.Linear(latent_dim, out_dim))
        self.classifier = nn.Linear(out_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """h: the encoder's posterior mean, before the projection."""
        return self.encoder(x)[0]

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """z: the projection MOON contrasts and the classifier reads."""
        return self.projection(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


@register_model("gpaf_cnn_moon")
def gpaf_cnn_moon(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return ProjectedEncoder(in_channels, num_classes, image_size)
