"""Shared fixtures: small synthetic MedMNIST-format files written in the real schema."""

from __future__ import annotations

import numpy as np
import pytest

from fedmedbench import io
from fedmedbench.data import synthetic


@pytest.fixture(scope="session")
def breast_arrays() -> dict[str, np.ndarray]:
    return synthetic.generate("breastmnist", 28, seed=0, counts={"train": 240, "val": 40, "test": 80})


@pytest.fixture(scope="session")
def breast_npz(tmp_path_factory, breast_arrays):
    path = tmp_path_factory.mktemp("data") / "breastmnist_28.npz"
    io.write_npz(path, breast_arrays)
    return path
