"""Ultralytics 8.3.48's HSV step on the installed Ultralytics: the same draws and saturation and value tables,
8.3.48's hue table (``train.hsv: ultralytics_8_3``, the default). Its own module, so the training set's builder
(``yolo``) and the pixel thread that defers the step (``pixel_thread``) both import it without importing each
other."""

from __future__ import annotations

import numpy as np


def hue_lut_83(factor: float, dtype=np.uint8) -> np.ndarray:
    """Ultralytics 8.3.48's hue look-up table (``data/augment.py``, ``RandomHSV``): OpenCV hue h (0..179) becomes
    ``h x factor mod 180``, ``factor`` drawn in [1 - hsv_h, 1 + hsv_h]."""
    return (np.arange(0, 256, dtype=np.float64) * factor % 180).astype(dtype)


class RandomHSV83:
    """Ultralytics' ``RandomHSV`` step with 8.3.48's hue rule: the same draws (one uniform triple per image) and
    the same saturation and value tables as the installed one (its ``lut_sat[0] = 0``, added in 8.3.79 and absent
    from 8.3.48, sets an entry that is 0 under both: 0 x gain). A module-level class, so that a dataset holding it
    pickles for dataloader workers started by spawn or forkserver."""

    def __init__(self, hgain: float = 0.5, sgain: float = 0.5, vgain: float = 0.5) -> None:
        self.hgain, self.sgain, self.vgain = hgain, sgain, vgain

    def __call__(self, labels: dict) -> dict:
        gains = self.draw(labels["img"])
        if gains is not None:
            self.apply(labels["img"], gains)
        return labels

    def draw(self, img: np.ndarray) -> np.ndarray | None:
        """The step's random gains for ``img`` (one draw from NumPy's stream), or None where it leaves it as it is."""
        if img.shape[-1] != 3 or not (self.hgain or self.sgain or self.vgain):
            return None
        return np.random.uniform(-1, 1, 3) * [self.hgain, self.sgain, self.vgain] + 1

    @staticmethod
    def apply(img: np.ndarray, gains: np.ndarray) -> None:
        """``img`` (BGR) with its hue, saturation and value moved by ``gains``, in place."""
        import cv2

        x = np.arange(0, 256, dtype=gains.dtype)
        luts = (hue_lut_83(gains[0], img.dtype), np.clip(x * gains[1], 0, 255).astype(img.dtype),
                np.clip(x * gains[2], 0, 255).astype(img.dtype))
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
        mapped = cv2.merge([cv2.LUT(channel, lut) for channel, lut in zip(cv2.split(hsv), luts, strict=True)])
        cv2.cvtColor(mapped, cv2.COLOR_HSV2BGR, dst=img)


def with_83_hue(compose):
    """``compose`` (an Ultralytics transform list) with each ``RandomHSV`` step replaced by :class:`RandomHSV83`."""
    from ultralytics.data.augment import RandomHSV

    compose.transforms = [RandomHSV83(t.hgain, t.sgain, t.vgain) if type(t) is RandomHSV else t
                          for t in compose.transforms]
    return compose
