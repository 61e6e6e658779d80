"""Client imaging domains built with the medmnistc library (MedMNIST-C corruptions).

A domain is a list of corruption steps applied in order to every image of a file.
A step is either

* ``{corruption: brightness, range: [lo, hi]}``: a medmnistc corruption class with a
  parameter drawn uniformly in [lo, hi] per image (medmnistc's ``augmentation=True``
  mode; lo == hi gives a fixed value), or
* ``{preset: motion_blur, severity: 3}``: the MedMNIST-C benchmark corruption for the
  dataset at severity 1..5 (``medmnistc.corruptions.registry.CORRUPTIONS_DS``).

medmnistc's corruptions are tuned for 224 px images (several fail at 28 px), and the
library applies them to RGB PIL images then converts back to greyscale for 1-channel
sets. We do the same: upscale to 224 (bicubic), corrupt, convert, downscale back to
the file's size (area). Every image gets its own RNG state derived from (seed,
domain name, split, index), so results do not depend on processing order.

GPAF's Scenario 1 domains (paper, Sec. 4): client 0 clean "high-end"; client 1
"mid-range" (brightness change 0.2%-15%, lower resolution, contrast 0.6-1.4);
client 2 "degraded" (brightness +0.3, Gaussian noise 0.12, contrast 0.5-1.5). See
``GPAF_SCENARIO1`` and config/config.yaml.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

from fedmedbench import compat
from fedmedbench.data.medmnist import SPLITS

WORK_SIZE = 224

#: name in config -> medmnistc corruption class name
CORRUPTION_CLASSES = {
    "brightness": "Brightness",
    "contrast": "Contrast",
    "saturate": "Saturate",
    "gamma": "GammaCorrection",
    "gaussian_noise": "GaussianNoise",
    "speckle_noise": "SpeckleNoise",
    "impulse_noise": "ImpulseNoise",
    "shot_noise": "ShotNoise",
    "pixelate": "Pixelate",
    "jpeg_compression": "JPEGCompression",
    "defocus_blur": "DefocusBlur",
    "motion_blur": "MotionBlur",
    "zoom_blur": "ZoomBlur",
    "gaussian_blur": "GaussianBlur",
}

GPAF_SCENARIO1: dict[str, list[dict]] = {
    "clean": [],
    "midrange": [
        {"corruption": "brightness", "range": [1.002, 1.15]},
        {"corruption": "pixelate", "range": [0.5, 0.5]},
        {"corruption": "contrast", "range": [0.6, 1.4]},
    ],
    "degraded": [
        {"corruption": "brightness", "range": [1.3, 1.3]},
        {"corruption": "gaussian_noise", "range": [0.12, 0.12]},
        {"corruption": "contrast", "range": [0.5, 1.5]},
    ],
}


class DomainSpecError(ValueError):
    """A corruption step in the config is not understood (message names it)."""


def _build_step(flag: str, step: dict, where: str):
    compat.patch_medmnistc()
    from medmnistc.corruptions import registry

    if "preset" in step:
        presets = registry.CORRUPTIONS_DS.get(flag)
        if presets is None:
            raise DomainSpecError(f"{where}: medmnistc has no presets for dataset '{flag}'")
        name = step["preset"]
        if name not in presets:
            raise DomainSpecError(f"{where}: unknown preset '{name}' for {flag}; choose from {sorted(presets)}")
        severity = int(step.get("severity", 1))
        if not 1 <= severity <= len(presets[name].severity_params):
            raise DomainSpecError(f"{where}: severity must be 1..{len(presets[name].severity_params)}")
        corruptor = presets[name]
        return _seeded(corruptor, lambda img: corruptor.apply(img, severity - 1))
    name = step.get("corruption")
    if name not in CORRUPTION_CLASSES:
        raise DomainSpecError(f"{where}: unknown corruption '{name}'; choose from {sorted(CORRUPTION_CLASSES)}")
    lo, hi = (float(v) for v in step.get("range", [None, None]))
    if lo > hi:
        raise DomainSpecError(f"{where}: range must be [lo, hi] with lo <= hi")
    cls = getattr(registry, CORRUPTION_CLASSES[name])
    corruptor = cls(severity_params=[lo, hi])
    return _seeded(corruptor, lambda img: corruptor.apply(img, augmentation=True))


def _seeded(corruptor, apply):
    """Wrap ``apply(img)`` as ``step(img, seed)``; corruptors that keep an ``rng`` get a fresh one."""

    def step(img, seed: int):
        corruptor.rng = np.random.default_rng(seed)  # used by ImpulseNoise; harmless elsewhere
        return apply(img)

    return step


def image_seed(seed: int, domain: str, split: str, index: int) -> int:
    return (zlib.crc32(f"{seed}/{domain}/{split}".encode()) * 1_000_003 + index) % (2**32)


def corrupt_images(images: np.ndarray, steps: Sequence, seed: int, domain: str, split: str) -> np.ndarray:
    """Apply the built steps to uint8 images (N,H,W) or (N,H,W,3); returns same shape/dtype."""
    if not steps:
        return images.copy()
    gray = images.ndim == 3
    size = images.shape[1]
    out = np.empty_like(images)
    state = np.random.get_state()
    try:
        for i, img in enumerate(images):
            s = image_seed(seed, domain, split, i)
            np.random.seed(s)
            pil = Image.fromarray(img).convert("RGB")
            if size != WORK_SIZE:
                pil = pil.resize((WORK_SIZE, WORK_SIZE), Image.BICUBIC)
            for step in steps:
                arr = np.clip(np.asarray(step(pil, s)), 0, 255).astype(np.uint8)
                pil = Image.fromarray(arr).convert("RGB")
            if gray:
                pil = pil.convert("L")
            if size != WORK_SIZE:
                pil = pil.resize((size, size), Image.BOX)
            out[i] = np.asarray(pil)
    finally:
        np.random.set_state(state)
    return out


def build_steps(flag: str, spec: list[dict], domain: str) -> list:
    return [_build_step(flag, step, f"domain '{domain}' step {k}") for k, step in enumerate(spec)]


def corrupt_dataset(data: dict[str, np.ndarray], flag: str, domain: str, spec: list[dict], seed: int) -> dict[str, np.ndarray]:
    """Return a copy of a MedMNIST array dict with every split corrupted by ``spec``."""
    steps = build_steps(flag, spec, domain)
    out = dict(data)
    for split in SPLITS:
        out[f"{split}_images"] = corrupt_images(data[f"{split}_images"], steps, seed, domain, split)
    return out
