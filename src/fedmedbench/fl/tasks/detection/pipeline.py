"""A local training's samples as Ultralytics 8.3.48 drew them, on the installed Ultralytics (``train.pipeline:
ultralytics_8_3``, the default).

Each step of the installed training transform list computes what 8.3.48's computes from the same input and random
state (Mosaic, the warp after it, HSV with 8.3.48's hue (``hsv.py``), the flips, Format; the validation letterbox
too). Five things around the steps differ, each changing which augmentation a sample draws, or its pixels:

1. Building a data set, the installed Ultralytics checks the read speed of ``random.sample(files, 5)``
   (``data/utils.py``, ``check_file_speeds``), a draw from Python's stream after the trainer seeded it; 8.3.48
   draws nothing there. The stream's state is restored after each build (:func:`keeps_python_stream`).
2. ``CutMix`` (not in 8.3.48) draws one ``random.uniform`` per sample even at p = 0. At p = 0 it is dropped.
3. ``Albumentations``: UltraFlwr's environment has no albumentations package, so its 8.3.48 skipped the step
   (no draw; no blur, median blur, grey or CLAHE, each on 1 % of the samples). The step is dropped.
4. With the mosaic closed (the last ``close_mosaic`` epochs), 8.3.48 letterboxes a frame to imgsz x imgsz before the
   warp and warps about the square's centre; the installed one warps the frame about its own centre, half a pixel
   off where the letterbox's pad is odd (:class:`Perspective83`).
5. 8.3.48 seeds the training loader's shuffle with a constant: every client, seed set and round sees the same
   sample order for the same number of frames. The installed one adds the training seed. The loader's generator
   is re-seeded with 8.3.48's constant before its first batch (:func:`shuffle_as_83`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: how a local training's samples are drawn: as Ultralytics 8.3.48 (UltraFlwr's pin) or as the installed one
PIPELINES = ("ultralytics_8_3", "installed")
#: 8.3.48's training-loader seed (``data/build.py``: this constant plus the process's RANK), whatever the run's seed
SHUFFLE_SEED_83 = 6148914691236517205


@contextmanager
def keeps_python_stream() -> Iterator[None]:
    """Python's ``random`` stream is, after the block, where it was before it."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


class Perspective83:
    """The installed ``RandomPerspective`` step preceded, for a frame that is not a mosaic, by 8.3.48's letterbox to
    imgsz x imgsz (a module-level class: a dataset holding it pickles for dataloader workers)."""

    def __init__(self, step: Any, imgsz: int) -> None:
        from ultralytics.data.augment import LetterBox

        self.step, self.imgsz = step, int(imgsz)
        self.letterbox = LetterBox(new_shape=(self.imgsz, self.imgsz))

    def __getattr__(self, name: str) -> Any:  # the step's settings, as Ultralytics reads them
        if name in ("step", "imgsz", "letterbox"):
            raise AttributeError(name)
        return getattr(self.step, name)

    def __call__(self, labels: dict) -> dict:
        if max(labels["img"].shape[:2]) <= self.imgsz:  # a frame as loaded (a mosaic is twice imgsz)
            labels = self.letterbox(labels)
        labels.pop("ratio_pad", None)  # as 8.3.48's warp
        return self.step(labels)


def with_83_steps(compose: Any, imgsz: int) -> Any:
    """``compose`` (an Ultralytics training transform list, nested lists included) without CutMix at p = 0 and
    Albumentations, its warp preceded by 8.3.48's letterbox (:class:`Perspective83`); changed in place."""
    from ultralytics.data.augment import Albumentations, Compose, CutMix, RandomPerspective

    steps = []
    for t in compose.transforms:
        if isinstance(t, Albumentations) or (isinstance(t, CutMix) and not t.p):
            continue
        if isinstance(t, RandomPerspective):
            t = Perspective83(t, imgsz)
        for inner in (t, getattr(t, "pre_transform", None)):  # the mosaic and warp, also as a mix step's source
            if isinstance(inner, Compose):
                with_83_steps(inner, imgsz)
        steps.append(t)
    compose.transforms = steps
    return compose


@dataclass
class _Build83:
    """A dataset's ``build_transforms`` whose lists take 8.3.48's steps (picklable, unlike a closure)."""

    build: Any
    imgsz: int

    def __call__(self, hyp: Any) -> Any:
        return with_83_steps(self.build(hyp), self.imgsz)


def use_83_steps(dataset: Any) -> None:
    """Make every transform list ``dataset`` (an Ultralytics training set) builds, now and again when the mosaic
    closes, take 8.3.48's steps (:func:`with_83_steps`)."""
    dataset.build_transforms = _Build83(dataset.build_transforms, int(dataset.imgsz))
    with_83_steps(dataset.transforms, int(dataset.imgsz))


def shuffle_as_83(loader: Any) -> None:
    """Seed ``loader``'s shuffle (a training loader no batch was taken from yet) as 8.3.48 seeded it."""
    from ultralytics.utils import RANK

    loader.generator.manual_seed(SHUFFLE_SEED_83 + RANK)
