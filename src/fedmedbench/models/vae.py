"""GPAF's networks as the paper describes them (Lakrouni et al., 2025, Sec. 3 and 4.1; ``gpaf_cnn``).

Client side: encoder E_s (two 4x4 stride-2 conv layers with 64 and 128 filters, then
linear heads for the posterior mean and log-variance of a d-dimensional latent,
d = 64 by default), decoder U_s (transposed convolutions back to the image), classifier
C_s (an MLP on the latent) and a latent discriminator D_s (an MLP with one logit).
Server side: the conditional generator G_w (MLP with LayerNorm and LeakyReLU that
outputs mu(y), log sigma^2(y); z = mu(y) + sigma(y) * eps) and the diversity
discriminator D_n (the same three-layer MLP as D_s).

``gpaf_cnn`` (encoder + classifier, evaluated on the posterior mean) is GPAF's client network in study
``gpaf_pathmnist`` and the network its baselines train there; study ``gpaf`` trains the authors' networks
(``models/gpaf_authors.py``). ``GPAFNet`` holds either encoder and classifier with either generator.
"""

from __future__ import annotations

import torch
from torch import nn

from fedmedbench.models.registry import register_model

LATENT_DIM = 64
LOGVAR_RANGE = (-10.0, 10.0)  # clamp: keeps exp(logvar) finite early in training


def _check_size(image_size: int) -> int:
    if image_size % 4:
        raise ValueError(f"the GPAF encoder needs an image size divisible by 4, got {image_size}")
    return image_size // 4


class ConvEncoder(nn.Module):
    """E_s: x -> (mu, logvar) of q(z|x); two conv layers (64, 128 filters, 4x4, stride 2)."""

    def __init__(self, in_channels: int, image_size: int, latent_dim: int = LATENT_DIM, filters: tuple[int, int] = (64, 128)):
        super().__init__()
        side = _check_size(image_size)
        self.latent_dim = latent_dim
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, filters[0], 4, stride=2, padding=1), nn.LeakyReLU(0.2),
            nn.Conv2d(filters[0], filters[1], 4, stride=2, padding=1), nn.BatchNorm2d(filters[1]), nn.LeakyReLU(0.2),
            nn.Flatten(),
        )
        self.head = nn.Linear(filters[1] * side * side, 2 * latent_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, logvar = self.head(self.features(x)).chunk(2, dim=1)
        return mu, logvar.clamp(*LOGVAR_RANGE)


class ConvDecoder(nn.Module):
    """U_s: z -> x_hat in [-1, 1] (the scale ``to_float`` gives images); mirrors the encoder."""

    def __init__(self, out_channels: int, image_size: int, latent_dim: int = LATENT_DIM, filters: tuple[int, int] = (64, 128)):
        super().__init__()
        self.side = _check_size(image_size)
        self.filters = filters
        self.fc = nn.Linear(latent_dim, filters[1] * self.side * self.side)
        self.net = nn.Sequential(
            nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(filters[1], filters[0], 4, stride=2, padding=1), nn.BatchNorm2d(filters[0]), nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(filters[0], out_channels, 4, stride=2, padding=1), nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(self.fc(z).view(-1, self.filters[1], self.side, self.side))


def mlp(sizes: list[int], out: int, act: type[nn.Module] = nn.LeakyReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), act(0.2) if act is nn.LeakyReLU else act()]
    layers.append(nn.Linear(sizes[-1], out))
    return nn.Sequential(*layers)


class LatentClassifier(nn.Module):
    """C_s: an MLP from the latent to class logits."""

    def __init__(self, latent_dim: int, num_classes: int, hidden: int = 128):
        super().__init__()
        self.net = mlp([latent_dim, hidden], num_classes)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class LatentDiscriminator(nn.Module):
    """D_s (client) and D_n (server): three-layer MLP -> one logit (sigmoid applied in the loss).

    ``num_classes > 0`` makes it conditional: the label vector is concatenated to z.
    """

    def __init__(self, latent_dim: int, hidden: tuple[int, int] = (256, 128), num_classes: int = 0):
        super().__init__()
        self.num_classes = num_classes
        self.net = mlp([latent_dim + num_classes, *hidden], 1)

    def forward(self, z: torch.Tensor, y_vec: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_classes:
            if y_vec is None:
                raise ValueError("a conditional discriminator needs the label vectors")
            z = torch.cat([z, y_vec], dim=1)
        return self.net(z).squeeze(1)


class ConditionalGenerator(nn.Module):
    """G_w(z|y): label vector (+ optional input noise) -> mu(y), log sigma^2(y); z = mu + sigma * eps.

    With ``noise_dim = 0`` (default) Q(z|y) is the Gaussian N(mu(y), sigma^2(y)) of the
    paper's reparameterisation z = mu(y) + sigma(y) * eps; ``noise_dim > 0`` also feeds
    noise into the MLP (a non-Gaussian Q(z|y), as in FedGen-style generators).
    """

    def __init__(self, num_classes: int, latent_dim: int = LATENT_DIM, hidden: int = 256, noise_dim: int = 0):
        super().__init__()
        self.num_classes, self.latent_dim, self.noise_dim = num_classes, latent_dim, noise_dim
        self.body = nn.Sequential(
            nn.Linear(num_classes + noise_dim, hidden), nn.LayerNorm(hidden), nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.LeakyReLU(0.2),
        )
        self.head = nn.Linear(hidden, 2 * latent_dim)

    def forward(self, y_vec: torch.Tensor, generator: torch.Generator | None = None,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(z, mu, logvar) for label vectors ``y_vec`` (B x C, one-hot or soft); ``noise`` (B x noise_dim) is
        drawn from ``generator`` unless given."""
        n = y_vec.shape[0]
        inp = y_vec
        if self.noise_dim:
            if noise is None:
                noise = randn(n, self.noise_dim, generator, y_vec.device)
            inp = torch.cat([y_vec, noise], dim=1)
        mu, logvar = self.head(self.body(inp)).chunk(2, dim=1)
        logvar = logvar.clamp(*LOGVAR_RANGE)
        return reparameterize(mu, logvar, generator), mu, logvar


def randn(n: int, d: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Standard normal noise drawn on the CPU from ``generator`` (device-independent, resumable); its copy to
    an accelerator does not wait for the device (the host keeps queueing)."""
    return torch.randn(n, d, generator=generator).to(device, non_blocking=True)


def reparameterize(mu: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return mu + torch.exp(0.5 * logvar) * randn(mu.shape[0], mu.shape[1], generator, mu.device)


def kl_to_standard_normal(mu: torch.Tensor, logvar: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """KL(N(mu, sigma^2) || N(0, I)), averaged (``mean``) or summed (``sum``) over batch and latent dimensions."""
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())
    return kl.sum() if reduction == "sum" else kl.mean()


class EncoderClassifier(nn.Module):
    """E_s + C_s: the part of GPAF's client model that is shared; logits from the posterior mean."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, latent_dim: int = LATENT_DIM,
                 classifier_hidden: int = 128):
        super().__init__()
        self.encoder = ConvEncoder(in_channels, image_size, latent_dim)
        self.classifier = LatentClassifier(latent_dim, num_classes, classifier_hidden)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The latent representation (posterior mean) used for t-SNE and MOON's contrast."""
        return self.encoder(x)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


class GPAFNet(EncoderClassifier):
    """E_s + C_s + the server's generator G_w: what the GPAF server broadcasts.

    The generator is part of the global arrays so that every client (from round 1 on)
    receives the current G_w with the encoder and classifier; it is trained on the
    server and never averaged. Evaluation (``forward``) uses E_s and C_s only.
    """

    def __init__(self, encoder: nn.Module, classifier: nn.Module, generator: nn.Module):
        nn.Module.__init__(self)
        self.encoder, self.classifier, self.generator = encoder, classifier, generator


@register_model("gpaf_cnn")
def gpaf_cnn(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return EncoderClassifier(in_channels, num_classes, image_size)
