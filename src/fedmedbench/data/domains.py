"""Client imaging domains: acquisition profiles and medmnistc (MedMNIST-C) corruptions.

A domain is a list of corruption steps applied in order to every image of a file.
A step is one of

* ``{corruption: brightness, range: [lo, hi]}``: a medmnistc corruption class with a
  parameter drawn uniformly in [lo, hi] per image (medmnistc's ``augmentation=True``
  mode; lo == hi gives a fixed value), or
* ``{preset: motion_blur, severity: 3}``: the MedMNIST-C benchmark corruption for the
  dataset at severity 1..5 (``medmnistc.corruptions.registry.CORRUPTIONS_DS``), or
* ``{profile: {contrast: [lo, hi], brightness: [lo, hi], noise: [lo, hi]}}``: an acquisition
  profile, x' = clip(c * x + b + sigma * eps, 0, 1) on the [0, 1] intensity scale, one clip
  at the end, eps ~ N(0, 1) per pixel. c, b and sigma are drawn uniformly once per domain
  (from the domain seed and the domain's name), so every image of a client shares the same
  device; only the noise differs from image to image, or
* ``{gpaf_device: {client: k, seed: 42}}``: the same transform with the device of client k in
  the GPAF authors' code (sanywright13/GPAFflower baselines/fedprox/fedprox/dataset_preparation.py,
  ``SameModalityDomainShift``): profile ``k % 3`` of (high-end, mid-range, older model),
  ``np.random.seed(seed + k)``, then sigma = noise level x U(0.9, 1.1), c ~ U(contrast range),
  b = shift x U(0.9, 1.1), drawn in that order (:func:`gpaf_device`). Client 1 gets
  c = 1.087, b = 0.185, sigma = 0.074; client 2 c = 0.605, b = 0.315, sigma = 0.128.

Resolution. Every step acts on the image at the resolution the data is used at, so a
corruption means at 28 px what its parameter says: Gaussian noise 0.12 is a pixel standard
deviation of 0.12 x 255 grey levels, ``pixelate 0.5`` a true reduction to half the side and
back. Only the corruptions in ``LARGE_CANVAS`` (the blurs built on ImageMagick / kernel radii
in 224 px units, and every benchmark preset, whose severities are tuned for 224 px) need a
larger canvas: such a step alone runs on the image enlarged by an integer factor k (nearest
neighbour, to ``size * ceil(224 / size)``) and is reduced back by k x k area averaging. That
round trip is exactly the identity on an uncorrupted image (tested), so resampling is neutral:
the clean client, which has no steps, is the same as a client that went through it.

Grey (1-channel) images are corrupted as greyscale ("L") images: the noise is drawn per grey
pixel. medmnistc's own pipeline converts them to RGB and back, which averages three
independent noise draws and shrinks the noise by a third; large-canvas steps still go through
RGB as medmnistc does. Every image gets its own RNG state derived from (seed, domain name,
split, index), NumPy's and Python's (medmnistc's microscopy corruptions draw from ``random``), so
results do not depend on processing order or on what the process drew before.

GPAF's Scenario 1 domains: client 0 clean "high-end"; clients 1 "mid-range" and 2 "degraded" with
the authors' devices (``gpaf_device`` 1 and 2, the values their runs used). ``midrange_profile`` and
``degraded_profile`` draw a device from the same ranges with the domain seed instead (mid-range:
contrast 0.6-1.4, brightness +0.2, noise 0.08; degraded: contrast 0.5-1.5, brightness +0.3, noise
0.12; shift and noise x U(0.9, 1.1)). The paper's text, read as MedMNIST-C corruptions, is kept as
``midrange_medmnistc`` (brightness 0.2%-15%, lower resolution, contrast 0.6-1.4) and
``degraded_medmnistc`` (brightness x1.3, Gaussian noise 0.12, contrast 0.5-1.5). See
``GPAF_SCENARIO1`` and config/config.yaml.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from fedmedbench import compat
from fedmedbench.data.medmnist import SPLITS

#: the canvas medmnistc's corruptions are tuned for
WORK_SIZE = 224

#: corruptions whose parameters are in 224 px units (run on an enlarged canvas, see above)
LARGE_CANVAS = frozenset({"motion_blur", "defocus_blur", "zoom_blur"})

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
    "midrange": [{"gpaf_device": {"client": 1}}],
    "degraded": [{"gpaf_device": {"client": 2}}],
    "midrange_profile": [{"profile": {"contrast": [0.6, 1.4], "brightness": [0.18, 0.22], "noise": [0.072, 0.088]}}],
    "degraded_profile": [{"profile": {"contrast": [0.5, 1.5], "brightness": [0.27, 0.33], "noise": [0.108, 0.132]}}],
    "midrange_medmnistc": [
        {"corruption": "brightness", "range": [1.002, 1.15]},
        {"corruption": "pixelate", "range": [0.5, 0.5]},
        {"corruption": "contrast", "range": [0.6, 1.4]},
    ],
    "degraded_medmnistc": [
        {"corruption": "brightness", "range": [1.3, 1.3]},
        {"corruption": "gaussian_noise", "range": [0.12, 0.12]},
        {"corruption": "contrast", "range": [0.5, 1.5]},
    ],
}
PROFILE_KEYS = ("contrast", "brightness", "noise")

#: the GPAF authors' equipment profiles (noise level, contrast range, brightness shift) of
#: ``SameModalityDomainShift``: high-end, mid-range, older model, for client_id % 3
GPAF_DEVICE_PROFILES = ((0.0, (1.0, 1.0), 0.0), (0.08, (0.6, 1.4), 0.2), (0.12, (0.5, 1.5), 0.3))


class DomainSpecError(ValueError):
    """A corruption step in the config is not understood (message names it)."""


def _range(value, where: str, key: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise DomainSpecError(f"{where}: {key} must be [lo, hi]") from None
    if lo > hi:
        raise DomainSpecError(f"{where}: {key} must be [lo, hi] with lo <= hi")
    return lo, hi


def gpaf_device(client: int, seed: int = 42) -> tuple[float, float, float]:
    """(c, b, sigma) the authors' code realises for ``client``: their global NumPy RNG seeded with
    seed + client_id (dataset_preparation.py:65), then noise, contrast, brightness (:98-100)."""
    noise, contrast, shift = GPAF_DEVICE_PROFILES[client % len(GPAF_DEVICE_PROFILES)]
    rs = np.random.RandomState(seed + client)  # what np.random.seed(s) followed by np.random.uniform draws
    sigma = noise * rs.uniform(0.9, 1.1)
    c = rs.uniform(*contrast)
    b = shift * rs.uniform(0.9, 1.1)
    return float(c), float(b), float(sigma)


def _device_step(c: float, b: float, sigma: float) -> Step:
    """x' = clip(c x + b + sigma eps, 0, 1) on the [0, 1] scale, eps per pixel (dataset_preparation.py:117-131)."""

    def apply(img: Image.Image, seed: int) -> np.ndarray:
        x = np.asarray(img, dtype=np.float64) / 255.0
        noise = np.random.default_rng(seed).standard_normal(x.shape) * sigma
        return np.round(np.clip(c * x + b + noise, 0.0, 1.0) * 255.0)

    return Step(apply, params=(c, b, sigma))


def _build_profile(spec: dict, where: str, domain_seed: int) -> Step:
    """An acquisition profile: one (contrast, brightness, noise) draw per domain, noise per pixel."""
    if not isinstance(spec, dict) or set(spec) - set(PROFILE_KEYS):
        raise DomainSpecError(f"{where}: profile takes {list(PROFILE_KEYS)}")
    ranges = [_range(spec.get(k, [default, default]), where, k) for k, default in zip(PROFILE_KEYS, (1.0, 0.0, 0.0), strict=True)]
    c, b, sigma = (float(v) for v in np.random.default_rng(domain_seed).uniform([r[0] for r in ranges], [r[1] for r in ranges]))
    return _device_step(c, b, sigma)


def _build_gpaf_device(spec: dict, where: str) -> Step:
    if not isinstance(spec, dict) or set(spec) - {"client", "seed"} or not isinstance(spec.get("client"), int):
        raise DomainSpecError(f"{where}: gpaf_device takes client (an integer) and seed")
    return _device_step(*gpaf_device(spec["client"], int(spec.get("seed", 42))))


def _build_step(flag: str, step: dict, where: str, domain_seed: int = 0):
    if "profile" in step:
        return _build_profile(step["profile"], where, domain_seed)
    if "gpaf_device" in step:
        return _build_gpaf_device(step["gpaf_device"], where)
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
        return Step(_seeded(corruptor, lambda img: corruptor.apply(img, severity - 1)), large_canvas=True)
    name = step.get("corruption")
    if name not in CORRUPTION_CLASSES:
        raise DomainSpecError(f"{where}: unknown corruption '{name}'; choose from {sorted(CORRUPTION_CLASSES)}")
    lo, hi = _range(step.get("range"), where, "range")
    cls = getattr(registry, CORRUPTION_CLASSES[name])
    corruptor = cls(severity_params=[lo, hi])
    return Step(_seeded(corruptor, lambda img: corruptor.apply(img, augmentation=True)), large_canvas=name in LARGE_CANVAS)


@dataclass(frozen=True)
class Step:
    """A built corruption: ``apply(pil_image, seed) -> array``, whether it needs the 224 px canvas and,
    for an acquisition device, its (c, b, sigma)."""

    apply: Callable
    large_canvas: bool = False
    params: tuple[float, ...] | None = None


#: medmnistc corruptions that draw from their own ``rng`` attribute; the others draw from NumPy's global
#: RNG, which :func:`corrupt_images` seeds per image (checked against medmnistc's source by the tests)
RNG_ATTRIBUTE_READERS = frozenset({"ImpulseNoise"})


def _seeded(corruptor, apply):
    """Wrap ``apply(img)`` as ``step(img, seed)``; a corruptor that reads its own ``rng`` gets a fresh one
    from the image's seed (building a Generator for every step of every image would cost more than
    most corruptions of a 28 px image)."""
    if type(corruptor).__name__ not in RNG_ATTRIBUTE_READERS:
        return lambda img, seed: apply(img)

    def step(img, seed: int):
        corruptor.rng = np.random.default_rng(seed)
        return apply(img)

    return step


def image_seed(seed: int, domain: str, split: str, index: int) -> int:
    return (zlib.crc32(f"{seed}/{domain}/{split}".encode()) * 1_000_003 + index) % (2**32)


def canvas_factor(size: int) -> int:
    """Integer enlargement k so that size * k >= 224 (1 for images already that large)."""
    return max(1, math.ceil(WORK_SIZE / size))


def _to_array(result, mode: str) -> np.ndarray:
    arr = np.clip(np.asarray(result), 0, 255).astype(np.uint8)
    if mode == "L" and arr.ndim == 3:  # a corruption that returned RGB for a grey input
        arr = np.asarray(Image.fromarray(arr).convert("L"))
    return arr


def apply_step(img: Image.Image, step: Step, seed: int) -> Image.Image:
    """One step at the image's own resolution, or on the exact nearest/area round-trip canvas."""
    mode = img.mode
    if not step.large_canvas:
        return Image.fromarray(_to_array(step.apply(img, seed), mode), mode)
    size = img.size[0]
    k = canvas_factor(size)
    big = img.convert("RGB").resize((size * k, size * k), Image.NEAREST)
    out = Image.fromarray(np.clip(np.asarray(step.apply(big, seed)), 0, 255).astype(np.uint8)).convert("RGB")
    return out.resize((size, size), Image.BOX).convert(mode)


def corrupt_images(images: np.ndarray, steps: Sequence[Step], seed: int, domain: str, split: str) -> np.ndarray:
    """Apply the built steps to uint8 images (N,H,W) or (N,H,W,3); returns same shape/dtype."""
    if not steps:
        return images.copy()
    mode = "L" if images.ndim == 3 else "RGB"
    out = np.empty_like(images)
    # medmnistc draws from NumPy's global RNG and, in its microscopy corruptions (bubble, stain deposit,
    # characters), from Python's: both are seeded per image and given back as they were
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        for i, img in enumerate(images):
            s = image_seed(seed, domain, split, i)
            np.random.seed(s)
            random.seed(s)
            pil = Image.fromarray(img).convert(mode)
            for step in steps:
                pil = apply_step(pil, step, s)
            out[i] = np.asarray(pil)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return out


def domain_seed(seed: int, domain: str, k: int) -> int:
    """Seed of a domain's own draws (a profile's device parameters) for its step k."""
    return (zlib.crc32(f"{seed}/{domain}/profile{k}".encode()) * 1_000_003) % (2**32)


def build_steps(flag: str, spec: list[dict], domain: str, seed: int = 0) -> list[Step]:
    return [_build_step(flag, step, f"domain '{domain}' step {k}", domain_seed(seed, domain, k)) for k, step in enumerate(spec)]


#: what :func:`device_of` gives a domain with no steps: the identity device (the clean client)
CLEAN_DEVICE = (1.0, 0.0, 0.0)


def device_of(spec: list[dict], domain: str, seed: int = 0) -> tuple[float, float, float]:
    """(c, b, sigma) of a domain that is one acquisition device (``gpaf_device`` or ``profile``), the same
    device :func:`corrupt_dataset` applies with ``seed``; :data:`CLEAN_DEVICE` for a domain without steps.
    Other domains have no device to redraw the noise of: DomainSpecError naming the domain."""
    if not spec:
        return CLEAN_DEVICE
    if len(spec) != 1 or not isinstance(spec[0], dict) or not {"gpaf_device", "profile"} & set(spec[0]):
        raise DomainSpecError(f"domain '{domain}': redrawing its noise at each read (client_augmentation: reference "
                              "or reference_train) needs a domain of one gpaf_device or profile step")
    (step,) = build_steps("", spec, domain, seed)
    c, b, sigma = step.params
    return float(c), float(b), float(sigma)


def corrupt_dataset(data: dict[str, np.ndarray], flag: str, domain: str, spec: list[dict], seed: int) -> dict[str, np.ndarray]:
    """Return a copy of a MedMNIST array dict with every split corrupted by ``spec``."""
    steps = build_steps(flag, spec, domain, seed)
    out = dict(data)
    for split in SPLITS:
        out[f"{split}_images"] = corrupt_images(data[f"{split}_images"], steps, seed, domain, split)
    return out
