"""The last pixel steps of a YOLO training sample run in a second thread while the next sample is drawn.

Ultralytics builds a training sample step after step, each step drawing its random numbers from the
process's ``random`` and NumPy streams and then changing the image. The steps at the end of the list (the HSV
step, the flips and ``Format``, which turns the image into a CHW tensor and may reverse its channels) take
their draws and change the labels in the loader's thread as before, in the same order; only their pixel work
(two colour conversions and the tables, the flips, the transpose and copy) is handed, in order, to one more
thread, and the batch waits for it where it is put together (``collate_fn``). The draws are the same draws,
the pixel operations the same operations on the same arrays: the same samples, bit for bit, with the pixel
work of one sample running while the loader draws and warps the next. Only where the loader runs in the
job's process (``workers=0``, UltraFlwr's): a worker process has its own streams and its own thread.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch


class _Pixels:
    """Hands each sample's pixel steps to the process's one pixel thread (made when first needed and shared by
    every dataset: one local training loads at a time, and each sample's steps stay in their order)."""

    _pool: ThreadPoolExecutor | None = None
    _lock = threading.Lock()

    def submit(self, img: np.ndarray, steps: list) -> Future:
        with _Pixels._lock:
            if _Pixels._pool is None:
                _Pixels._pool = ThreadPoolExecutor(1, thread_name_prefix="yolo-pixels")
        return _Pixels._pool.submit(_run, img, steps)


def _run(img: np.ndarray, steps: list) -> torch.Tensor:
    for kind, step, params in steps:
        if kind == "hsv":
            step.apply(img, params)
        elif kind == "image":
            img = step.apply_image({"img": img}, params)["img"]
        else:  # "format": as Format._format_img, with its channel draw already made
            if len(img.shape) < 3:
                img = img[..., None]
            img = img.transpose(2, 0, 1)
            img = torch.from_numpy(np.ascontiguousarray(img[::-1] if params and img.shape[0] == 3 else img))
    return img


class _Deferred:
    """A step whose draws and label changes run now and whose pixel work is queued on ``labels['_pixels']``."""

    def __init__(self, step: Any, pixels: _Pixels) -> None:
        self.step, self.pixels = step, pixels

    def __getattr__(self, name: str) -> Any:  # the step's settings (p, direction, ...), as Ultralytics reads them
        if name in ("step", "pixels"):
            raise AttributeError(name)
        return getattr(self.step, name)


class DeferredHSV(_Deferred):
    def __call__(self, labels: dict) -> dict:
        params = self.step.draw(labels["img"])
        if params is not None:
            labels.setdefault("_pixels", []).append(("hsv", self.step, params))
        return labels


class DeferredFlip(_Deferred):
    def __call__(self, labels: dict) -> dict:
        step = self.step
        params = step.get_params(labels)
        labels.setdefault("_pixels", []).append(("image", step, params))
        labels = step.apply_instances(labels, params)
        labels = step.apply_semantic(labels, params)
        return step.apply_depth(labels, params)


class DeferredFormat(_Deferred):
    def __call__(self, labels: dict) -> dict:
        step = self.step
        params = step.get_params(labels)
        img = labels.pop("img", None)
        if img is not None:
            reverse = random.uniform(0, 1) > step.bgr  # Format._format_img's draw, made here in its turn
            steps = [*labels.pop("_pixels", []), ("format", None, reverse)]
            labels["img"] = self.pixels.submit(img, steps)
        labels = step.apply_instances(labels, params)
        labels = step.apply_semantic(labels, params)
        return step.apply_depth(labels, params)


def defer_tail(compose: Any, pixels: _Pixels) -> bool:
    """Replace the steps at the end of ``compose`` (an Ultralytics transform list) that can hand their pixel work
    over (:class:`~fedmedbench.fl.tasks.detection.hsv.RandomHSV83`, ``RandomFlip``, ending with ``Format``)
    by their deferring versions; whether it did (a list not ending so is left as it is)."""
    from ultralytics.data.augment import Format, RandomFlip

    from fedmedbench.fl.tasks.detection.hsv import RandomHSV83

    kinds = {RandomHSV83: DeferredHSV, RandomFlip: DeferredFlip, Format: DeferredFormat}
    steps = compose.transforms
    if not steps or type(steps[-1]) is not Format:
        return False
    start = len(steps)
    while start > 0 and type(steps[start - 1]) in kinds:
        start -= 1
    compose.transforms = steps[:start] + [kinds[type(t)](t, pixels) for t in steps[start:]]
    return True


class CollatePixels:
    """A loader's ``collate_fn`` taking each sample's image from the pixel thread first (a class: it pickles)."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, batch: list[dict]) -> dict:
        for sample in batch:
            if isinstance(sample.get("img"), Future):
                sample["img"] = sample["img"].result()
        return self.collate(batch)


class _BuildDeferred:
    """A dataset's ``build_transforms`` whose lists hand their last pixel steps over (again after close_mosaic)."""

    def __init__(self, build: Any, pixels: _Pixels) -> None:
        self.build, self.pixels = build, pixels

    def __call__(self, hyp: Any) -> Any:
        compose = self.build(hyp)
        defer_tail(compose, self.pixels)
        return compose


def use_pixel_thread(dataset: Any) -> bool:
    """Make ``dataset`` (an Ultralytics training set loaded in this process) run its last pixel steps in a second
    thread, now and whenever its transforms are rebuilt; whether it does (its list must end with ``Format``)."""
    if isinstance(dataset.build_transforms, _BuildDeferred):
        return True
    pixels = _Pixels()
    if not defer_tail(dataset.transforms, pixels):
        return False
    dataset.build_transforms = _BuildDeferred(dataset.build_transforms, pixels)
    dataset.collate_fn = CollatePixels(dataset.collate_fn)
    return True
