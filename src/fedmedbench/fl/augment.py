"""Client training batches, optionally as the GPAF authors' loader reads them.

Every client training loop takes its float batches from :func:`batch_images`. Without augmentation
(``ClientData.aug_x`` is None) that is ``to_float`` of the stored images, bit for bit. With the study's
``client_augmentation: reference`` (or ``reference_train``) each client also holds its clean (noise-free) training images and,
per image, its acquisition device (contrast c, brightness b, noise sigma), and every read of a batch
goes through the authors' ``BreastMnistDataset.__getitem__`` (sanywright13/GPAFflower
baselines/fedprox/fedprox/dataset_preparation.py at c2505a7, :302-322): on the [0, 1] scale

1. the domain shift, x' = clamp(c x + b + sigma eps, 0, 1), eps ~ N(0, 1) per pixel, drawn anew at
   every read (``SameModalityDomainShift.apply_transform``, :117-131; the clean client is (1, 0, 0));
2. their ``buid_domain_transform`` (:37-43): horizontal flip with p 0.5, rotation by an angle
   ~ U(-45, 45) degrees (nearest neighbour, zero fill outside the image, torchvision's
   ``RandomRotation(45)``), Gaussian blur with p 0.5 (kernel 5 wide x 9 high, sigma ~ U(0.1, 5),
   reflect padding, torchvision's ``GaussianBlur((5, 9), (0.1, 5))``), then Normalize(0.5, 0.5),
   i.e. the [-1, 1] scale of ``to_float``.

Under ``reference`` the server's validation of the global model reads the clients' validation shares
the same way (the authors' validation loaders use the same dataset class, dataset.py:104-108), with a
generator of (run seed, round) (:func:`validation_generator`), and so does a client validating its own
model (``client_validation``), from its generator; ``reference_train`` leaves them as stored.
Test shares are always the stored images (the authors never score their test loader).

Every training draw comes from the client's generator (``ClientContext.generator``), so a run is repeatable
and resumable; the numbers are drawn on the CPU (the same on every device) and copied to the batch's
device without the host waiting (``training.on_device``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fedmedbench.fl.determinism import seeded_generator
from fedmedbench.fl.training import on_device, to_float

if TYPE_CHECKING:
    from fedmedbench.fl.api.method import ClientContext, ClientData

#: what ``client_augmentation`` may be (the schema's enum mirrors it): none = the stored images as they
#: are; reference = the GPAF authors' per-read domain noise and transforms on the clients' training and
#: validation shares, as their loaders; reference_train = on the training shares only (validation as stored)
CLIENT_AUGMENTATIONS = ("none", "reference", "reference_train")
#: the modes that also read the validation shares through the authors' loader
VALIDATION_AUGMENTATIONS = ("reference",)
#: the third entry of the validation reads' seed (run seed, round, this): apart from every client stream
VALIDATION_STREAM = 2**31 - 1

#: torchvision's transforms of the authors' ``buid_domain_transform``
FLIP_P = 0.5
ROTATION_DEGREES = 45.0
BLUR_P = 0.5
BLUR_KERNEL = (5, 9)  # (width, height), torchvision's kernel_size order
BLUR_SIGMA = (0.1, 5.0)


def validation_generator(seed: int, rnd: int) -> torch.Generator:
    """The generator of round ``rnd``'s validation reads: (run seed, round) fix them, so an evaluation
    draws the same images in a resumed run as in an uninterrupted one."""
    return seeded_generator(seed, rnd, VALIDATION_STREAM)


def device_shift(x01: torch.Tensor, device_rows: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """clamp(c x + b + sigma eps, 0, 1) per image; ``device_rows`` (B, 3) holds (c, b, sigma)."""
    c, b, sigma = (device_rows[:, k].view(-1, 1, 1, 1).to(x01.dtype) for k in range(3))
    return torch.clamp(x01 * c + b + eps * sigma, 0.0, 1.0)


def hflip(x: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror the images whose ``flip`` entry is true left to right."""
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotate each image counter-clockwise by its angle about the image centre, nearest neighbour,
    zero outside (torchvision's tensor ``rotate`` with expand False, centre None, fill 0)."""
    n, _, h, w = x.shape
    rad = degrees.to(torch.float64) * (math.pi / 180.0)
    cos, sin = torch.cos(rad).to(x.dtype), torch.sin(rad).to(x.dtype)
    # the inverse map: output pixel (u, v), centred, reads input (u cos - v sin, u sin + v cos)
    theta = torch.stack([torch.stack([cos, -sin, torch.zeros_like(cos)], 1),
                         torch.stack([sin, cos, torch.zeros_like(cos)], 1)], 1)
    theta = on_device(theta, x.device)  # (B, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=x.dtype, device=x.device)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 - 0.5, steps=w, device=x.device))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 - 0.5, steps=h, device=x.device).unsqueeze(-1))
    base[..., 2].fill_(1.0)
    scale = torch.tensor([0.5 * w, 0.5 * h], dtype=x.dtype, device=x.device)
    grid = base.view(1, h * w, 3).expand(n, -1, -1).bmm(theta.transpose(1, 2) / scale).view(n, h, w, 2)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def gaussian_kernel1d(size: int, sigma: torch.Tensor) -> torch.Tensor:
    """(B, size) normalised Gaussian weights at offsets -(size-1)/2 .. (size-1)/2, one row per sigma."""
    half = (size - 1) * 0.5
    offsets = torch.linspace(-half, half, steps=size, dtype=sigma.dtype, device=sigma.device)
    pdf = torch.exp(-0.5 * (offsets.view(1, -1) / sigma.view(-1, 1)).pow(2))
    return pdf / pdf.sum(dim=1, keepdim=True)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: tuple[int, int] = BLUR_KERNEL) -> torch.Tensor:
    """Blur each image with its own sigma: the (height x width) kernel k_y k_x^T, reflect padding."""
    n, ch, h, w = x.shape
    kx = gaussian_kernel1d(kernel[0], sigma.to(x.dtype))
    ky = gaussian_kernel1d(kernel[1], sigma.to(x.dtype))
    k2 = torch.bmm(ky.unsqueeze(2), kx.unsqueeze(1))  # (B, ky, kx)
    weight = on_device(k2.repeat_interleave(ch, dim=0).unsqueeze(1), x.device)  # (B*C, 1, ky, kx)
    padded = F.pad(x.reshape(1, n * ch, h, w), [kernel[0] // 2, kernel[0] // 2, kernel[1] // 2, kernel[1] // 2],
                   mode="reflect")
    return F.conv2d(padded, weight, groups=n * ch).view(n, ch, h, w)


def reference_transform(x01: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The authors' flip, rotation and blur of images on the [0, 1] scale (before Normalize)."""
    n = x01.shape[0]
    flip = torch.rand(n, generator=generator) < FLIP_P
    angle = torch.rand(n, generator=generator, dtype=torch.float64) * (2 * ROTATION_DEGREES) - ROTATION_DEGREES
    blur = torch.rand(n, generator=generator) < BLUR_P
    sigma = torch.rand(n, generator=generator, dtype=torch.float64) * (BLUR_SIGMA[1] - BLUR_SIGMA[0]) + BLUR_SIGMA[0]
    x = rotate(hflip(x01, on_device(flip, x01.device)), angle)
    return torch.where(on_device(blur, x.device).view(-1, 1, 1, 1), gaussian_blur(x, sigma), x)


def reference_batch(x_u8: torch.Tensor, device_rows: torch.Tensor, device: torch.device,
                    generator: torch.Generator) -> torch.Tensor:
    """One read of clean uint8 images as the authors' loader gives them: domain shift with fresh noise,
    flip, rotation, blur, on [-1, 1]."""
    x01 = x_u8.to(device, non_blocking=True).float().div_(255.0)
    eps = on_device(torch.randn(x01.shape, generator=generator), device)
    x = device_shift(x01, on_device(device_rows, device), eps)
    return reference_transform(x, generator).sub_(0.5).div_(0.5)


def read_all(x_u8: torch.Tensor, device_rows: torch.Tensor, generator: torch.Generator, batch_size: int = 256) -> torch.Tensor:
    """One read of every image (float, [-1, 1], on the CPU), in order, ``batch_size`` at a time."""
    if x_u8.shape[0] == 0:
        return torch.zeros(x_u8.shape, dtype=torch.float32)
    cpu = torch.device("cpu")
    return torch.cat([reference_batch(x_u8[s : s + batch_size].cpu(), device_rows[s : s + batch_size].cpu(), cpu, generator)
                      for s in range(0, x_u8.shape[0], batch_size)])


def batch_images(data: ClientData, idx: torch.Tensor, device: torch.device, generator: torch.Generator,
                 channels_last: bool = False) -> torch.Tensor:
    """The float training batch of rows ``idx``: ``to_float`` of the stored images, or, where the client
    holds clean images and devices (``client_augmentation: reference | reference_train``), a fresh read as above."""
    if data.aug_x is None:
        return to_float(data.train_x[idx], device, channels_last)
    x = reference_batch(data.aug_x[idx], data.aug_device[idx], torch.device(device), generator)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def batch_reader(ctx: ClientContext) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``images`` for :func:`fedmedbench.fl.training.local_sgd`: the client's augmented reads, or None
    (``local_sgd``'s own ``to_float``) when it holds no clean images."""
    if ctx.data.aug_x is None:
        return None
    return lambda idx: batch_images(ctx.data, idx, ctx.device, ctx.generator, ctx.train.channels_last)
