"""GPAF's networks as the authors' code builds them (study ``gpaf``'s default; docs/gpaf.md, fidelity table).

Client (sanywright13/GPAFflower at c2505a7, baselines/fedprox/fedprox/models.py; client.py:393-397):

* E_s ``ResNetEncoder`` (:277-367): ResNet-18 BasicBlocks [2, 2, 2, 2] with a 3x3 stride-1 first
  convolution for 28 px and no max-pool, widths 64-128-256-512, global average pool, then
  fc 512 -> 512, BatchNorm1d, LeakyReLU(0.2) and the mu / log-variance heads (512 -> d). Convolutions
  Kaiming-normal (fan_out), BatchNorm weight 1 and bias 0 (:309-314). 11,497,024 parameters at 1
  channel, d = 64.
* C_s ``MLPClassifier`` (:448-463): d -> 512 -> 256 -> classes, LeakyReLU(0.2); 165,122 parameters.
* D_s ``SigmoidDiscriminator`` (:418-435): d -> 512 -> 256 -> 1 and a Sigmoid (the client's losses are
  ``BCELoss`` on probabilities); 164,865 parameters.

Server (sanywright13/update-gpaf at 6aea7f8, fedprox/fedprox/models.py ``GlobalGenerator``):

* G_w ``NoiseLabelGenerator``: noise (64) and one-hot label each projected to 256 by Linear + LayerNorm +
  LeakyReLU(0.2), concatenated noise first, mu / log-variance heads (512 -> d), z = mu + sigma * eps,
  then a last Linear(d, d) on the sample; 88,256 parameters with 2 classes, d = 64.

The module and parameter names are the authors', so ``tests/test_gpaf_authors_networks.py`` compares every
name and shape with the lists counted from their classes.
"""

from __future__ import annotations

import torch
from torch import nn

from fedmedbench.models.registry import register_model
from fedmedbench.models.vae import LATENT_DIM, EncoderClassifier, randn, reparameterize


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


def resnet_stages(inplanes: int, widths: tuple[int, ...], blocks: tuple[int, ...]) -> list[nn.Sequential]:
    """ResNet stages: the first of each stage (after the first) halves the resolution."""
    stages = []
    for i, (planes, n) in enumerate(zip(widths, blocks, strict=True)):
        layers = [BasicBlock(inplanes, planes, 1 if i == 0 else 2)]
        layers += [BasicBlock(planes, planes) for _ in range(n - 1)]
        stages.append(nn.Sequential(*layers))
        inplanes = planes
    return stages


def init_resnet(module: nn.Module) -> None:
    """Kaiming-normal (fan_out, ReLU) convolutions, BatchNorm2d weight 1 and bias 0, as both authors' ResNets."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


class ResNetEncoder(nn.Module):
    """E_s: x -> (mu, logvar); ResNet-18 for 28 px images, then a 512-unit layer and the two heads."""

    def __init__(self, in_channels: int, latent_dim: int = LATENT_DIM, widths: tuple[int, ...] = (64, 128, 256, 512)):
        super().__init__()
        self.latent_dim = latent_dim
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet_stages(widths[0], widths, (2, 2, 2, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1], 512)
        self.bn_fc = nn.BatchNorm1d(512)
        self.leakyrelu = nn.LeakyReLU(0.2, inplace=True)
        self.mu = nn.Linear(512, latent_dim)
        self.logvar = nn.Linear(512, latent_dim)
        init_resnet(self)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.leakyrelu(self.bn_fc(self.fc(torch.flatten(self.avgpool(x), 1))))
        return self.mu(x), self.logvar(x)


class MLPClassifier(nn.Module):
    """C_s: d -> 512 -> 256 -> classes, LeakyReLU(0.2)."""

    def __init__(self, latent_dim: int, num_classes: int):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 512), nn.LeakyReLU(0.2), nn.Linear(512, 256), nn.LeakyReLU(0.2),
                                   nn.Linear(256, num_classes))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z)


class SigmoidDiscriminator(nn.Module):
    """D_s: d -> 512 -> 256 -> 1 -> Sigmoid: the probability that z came from G_w."""

    def __init__(self, latent_dim: int):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 512), nn.LeakyReLU(0.2), nn.Linear(512, 256), nn.LeakyReLU(0.2),
                                   nn.Linear(256, 1), nn.Sigmoid())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z).squeeze(1)


class NoiseLabelGenerator(nn.Module):
    """G_w(noise, y): noise and label each projected to ``hidden``, concatenated, Gaussian head, sampled, projected.

    ``forward(y_vec, generator, noise=None)`` returns (output, mu, logvar); the noise is drawn from ``generator``
    unless given (the server's G_w step reuses its D_n step's noise with a new eps, as the authors' loop).
    """

    def __init__(self, num_classes: int, latent_dim: int = LATENT_DIM, hidden: int = 256, noise_dim: int = 64):
        super().__init__()
        if noise_dim < 1:
            raise ValueError("method_params.gpaf.noise_dim: the authors' generator (generator_arch: authors) needs noise_dim >= 1")
        self.num_classes, self.latent_dim, self.noise_dim = num_classes, latent_dim, noise_dim
        self.noise_proj = nn.Sequential(nn.Linear(noise_dim, hidden), nn.LayerNorm(hidden), nn.LeakyReLU(0.2))
        self.label_proj = nn.Sequential(nn.Linear(num_classes, hidden), nn.LayerNorm(hidden), nn.LeakyReLU(0.2))
        self.mu_proj = nn.Linear(2 * hidden, latent_dim)
        self.logvar_proj = nn.Linear(2 * hidden, latent_dim)
        self.output_proj = nn.Linear(latent_dim, latent_dim)

    def forward(self, y_vec: torch.Tensor, generator: torch.Generator | None = None,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if noise is None:
            noise = randn(y_vec.shape[0], self.noise_dim, generator, y_vec.device)
        h = torch.cat([self.noise_proj(noise), self.label_proj(y_vec)], dim=1)
        mu, logvar = self.mu_proj(h), self.logvar_proj(h)
        return self.output_proj(reparameterize(mu, logvar, generator)), mu, logvar


#: the ResNet encoder's stage widths by model name: the authors' and a narrow one for quick demos
RESNET_WIDTHS = {"gpaf_resnet18": (64, 128, 256, 512), "gpaf_resnet18_tiny": (8, 16, 32, 64)}


class ResNetEncoderClassifier(EncoderClassifier):
    """E_s + C_s of the authors' client: logits from the posterior mean (their encoder returns mu in eval mode)."""

    def __init__(self, in_channels: int, num_classes: int, latent_dim: int = LATENT_DIM,
                 widths: tuple[int, ...] = RESNET_WIDTHS["gpaf_resnet18"]):
        nn.Module.__init__(self)
        self.encoder = ResNetEncoder(in_channels, latent_dim, widths)
        self.classifier = MLPClassifier(latent_dim, num_classes)


@register_model("gpaf_resnet18")
def gpaf_resnet18(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return ResNetEncoderClassifier(in_channels, num_classes)


@register_model("gpaf_resnet18_tiny")
def gpaf_resnet18_tiny(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """The same network with stages 8-16-32-64 wide (the demo's, for a quick run on a CPU)."""
    return ResNetEncoderClassifier(in_channels, num_classes, widths=RESNET_WIDTHS["gpaf_resnet18_tiny"])
