"""Deterministic synthetic stand-in for a MedMNIST file, for the offline demo and tests.

It writes the exact MedMNIST npz schema of the requested flag (keys, dtypes, channel
count, image size, label shape (N, 1), number of classes), so everything downstream
runs through the same loader as real data. Numbers obtained on it are NOT a
reproduction of any paper; every table built from it says "synthetic".

Each class has a prototype image (a few smooth Gaussian blobs plus an oriented
grating, and for RGB a class tint). A sample is its class prototype, randomly
shifted, scaled in contrast, mixed with a random other prototype and noised.
``difficulty`` in [0, 1] sets the mixing weight and the noise level: 0 is trivially
separable, 1 is nearly chance. Classes are learnable by a small CNN at the default
(0.5); the test suite checks that.
"""

from __future__ import annotations

import numpy as np

from fedmedbench.data.medmnist import SPLITS, dataset_info, label_dtype


def _prototypes(rng: np.random.Generator, n_classes: int, size: int, channels: int) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    protos = np.zeros((n_classes, size, size, channels), dtype=np.float32)
    for c in range(n_classes):
        img = np.zeros((size, size), dtype=np.float32)
        for _ in range(3):
            cx, cy = rng.uniform(0.2, 0.8, size=2)
            sigma = rng.uniform(0.08, 0.2)
            amp = rng.uniform(0.5, 1.0) * rng.choice([-1.0, 1.0])
            img += amp * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma**2))
        theta = np.pi * c / n_classes + rng.uniform(0, np.pi / (2 * n_classes))
        freq = rng.uniform(2.0, 5.0)
        img += 0.4 * np.sin(2 * np.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)))
        img = (img - img.min()) / (img.max() - img.min() + 1e-8)
        tint = rng.uniform(0.5, 1.0, size=channels) if channels == 3 else np.ones(1)
        protos[c] = img[..., None] * tint[None, None, :]
    return protos


def default_counts(flag: str, max_per_split: dict[str, int] | None = None) -> dict[str, int]:
    """Split sizes: the real ones, capped (the demo wants small files)."""
    caps = max_per_split or {"train": 1200, "val": 200, "test": 400}
    real = dataset_info(flag).n_samples
    return {s: int(min(real[s], caps[s])) for s in SPLITS}


def class_prior(n_classes: int, imbalance: float) -> np.ndarray:
    """Geometric class prior: ``imbalance`` = ratio of the largest to the smallest class."""
    if n_classes == 1:
        return np.ones(1)
    ratios = imbalance ** (-np.arange(n_classes) / (n_classes - 1))
    return ratios / ratios.sum()


def generate(
    flag: str,
    size: int,
    seed: int = 0,
    counts: dict[str, int] | None = None,
    difficulty: float = 0.5,
    imbalance: float = 1.0,
) -> dict[str, np.ndarray]:
    """Return arrays in the official schema (``{split}_images`` uint8, ``{split}_labels`` uint8 (N,1))."""
    if not 0.0 <= difficulty <= 1.0:
        raise ValueError(f"synthetic difficulty must be in [0, 1], got {difficulty}")
    if imbalance < 1.0:
        raise ValueError(f"synthetic imbalance must be >= 1, got {imbalance}")
    info = dataset_info(flag)
    counts = counts or default_counts(flag)
    rng = np.random.default_rng(np.random.SeedSequence([seed, size, info.n_classes, info.n_channels]))
    protos = _prototypes(rng, info.n_classes, size, info.n_channels)
    prior = class_prior(info.n_classes, imbalance)
    mix = 0.55 * difficulty
    noise = 0.05 + 0.35 * difficulty
    max_shift = max(1, size // 14)
    out: dict[str, np.ndarray] = {}
    for split in SPLITS:
        n = int(counts[split])
        labels = rng.choice(info.n_classes, size=n, p=prior)
        # every class present in every split when possible (as in the real files)
        if n >= info.n_classes:
            labels[: info.n_classes] = rng.permutation(info.n_classes)
        others = rng.integers(0, info.n_classes, size=n)
        images = np.empty((n, size, size, info.n_channels), dtype=np.uint8)
        for i in range(n):
            base = (1 - mix) * protos[labels[i]] + mix * protos[others[i]]
            dy, dx = rng.integers(-max_shift, max_shift + 1, size=2)
            base = np.roll(base, (dy, dx), axis=(0, 1))
            contrast = rng.uniform(0.8, 1.2)
            img = 0.5 + contrast * (base - 0.5) + rng.normal(0, noise, size=base.shape)
            images[i] = np.clip(img * 255.0, 0, 255).astype(np.uint8)
        if info.n_channels == 1:
            images = images[..., 0]
        out[f"{split}_images"] = images
        out[f"{split}_labels"] = labels.astype(label_dtype(np.arange(info.n_classes))).reshape(-1, 1)
    return out
