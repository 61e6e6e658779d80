"""MedMNIST-C client domains via medmnistc: deterministic, per-image seeded, the corruptions they promise."""

from __future__ import annotations

import numpy as np
import pytest

from fedmedbench.data import domains


@pytest.fixture(scope="module")
def small(breast_arrays):
    return {k: v[:40] for k, v in breast_arrays.items()}


def test_clean_domain_is_identity(small):
    out = domains.corrupt_dataset(small, "breastmnist", "clean", [], seed=0)
    assert all(np.array_equal(out[k], small[k]) for k in small)


def test_deterministic_and_order_independent(small):
    spec = domains.GPAF_SCENARIO1["degraded"]
    a = domains.corrupt_dataset(small, "breastmnist", "degraded", spec, seed=0)
    b = domains.corrupt_dataset(small, "breastmnist", "degraded", spec, seed=0)
    assert np.array_equal(a["train_images"], b["train_images"])
    # image i's corruption depends on (seed, domain, split, i) only, not on the rest of the batch
    steps = domains.build_steps("breastmnist", spec, "degraded")
    first6 = domains.corrupt_images(small["train_images"][:6], steps, 0, "degraded", "train")
    assert np.array_equal(first6, a["train_images"][:6])
    c = domains.corrupt_dataset(small, "breastmnist", "degraded", spec, seed=1)
    assert not np.array_equal(a["train_images"], c["train_images"])


def test_shapes_dtypes_and_labels_preserved(small):
    out = domains.corrupt_dataset(small, "breastmnist", "midrange", domains.GPAF_SCENARIO1["midrange"], seed=0)
    for k in small:
        assert out[k].shape == small[k].shape and out[k].dtype == small[k].dtype
    assert np.array_equal(out["train_labels"], small["train_labels"])


def test_corruptions_do_what_they_say(small):
    x = small["train_images"].astype(float)
    bright = domains.corrupt_dataset(small, "breastmnist", "b", [{"corruption": "brightness", "range": [1.3, 1.3]}], 0)
    assert bright["train_images"].mean() > x.mean() + 5
    noisy = domains.corrupt_dataset(small, "breastmnist", "n", [{"corruption": "gaussian_noise", "range": [0.12, 0.12]}], 0)
    diff = noisy["train_images"].astype(float) - x
    assert diff.std() > 5  # pixel noise survives the 224 -> 28 resize
    flat = domains.corrupt_dataset(small, "breastmnist", "c", [{"corruption": "contrast", "range": [0.5, 0.5]}], 0)
    assert flat["train_images"].astype(float).std() < x.std()


def test_preset_from_the_benchmark(small):
    out = domains.corrupt_dataset(small, "breastmnist", "p", [{"preset": "motion_blur", "severity": 3}], 0)
    assert not np.array_equal(out["test_images"], small["test_images"])
    with pytest.raises(domains.DomainSpecError, match="unknown preset"):
        domains.build_steps("breastmnist", [{"preset": "nope", "severity": 1}], "p")
    with pytest.raises(domains.DomainSpecError, match="unknown corruption"):
        domains.build_steps("breastmnist", [{"corruption": "nope", "range": [1, 1]}], "p")


def test_rgb_domain(tmp_path):
    from fedmedbench.data import synthetic

    rgb = synthetic.generate("pathmnist", 28, seed=0, counts={"train": 10, "val": 4, "test": 4})
    out = domains.corrupt_dataset(rgb, "pathmnist", "d", domains.GPAF_SCENARIO1["degraded"], 0)
    assert out["train_images"].shape == (10, 28, 28, 3)
