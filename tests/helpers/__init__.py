"""Helpers shared by tests."""

import numpy as np


def split_labels(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Flat int labels per split from MedMNIST-format arrays."""
    return {s: arrays[f"{s}_labels"].reshape(-1).astype(np.int64) for s in ("train", "val", "test")}
