"""Client imaging domains (acquisition profiles, medmnistc corruptions): deterministic, per-image seeded,
applied at the data's own resolution, and strong enough to differ (GPAF Scenario 1)."""

from __future__ import annotations

import numpy as np
import pytest

from fedmedbench.data import domains


@pytest.fixture(scope="module")
def small(breast_arrays):
    return {k: v[:40] for k, v in breast_arrays.items()}


def test_clean_domain_is_identity(small):
    out = domains.corrupt_dataset(small, "breastmnist", "clean", domains.GPAF_SCENARIO1["clean"], seed=0)
    assert all(out[k].tobytes() == small[k].tobytes() and out[k].dtype == small[k].dtype for k in small)


def _flat(n=30, value=128):
    return np.full((n, 28, 28), value, np.uint8)


def _checkerboard(n=10):
    board = (np.indices((28, 28)).sum(0) % 2 * 200 + 20).astype(np.uint8)
    return np.repeat(board[None], n, 0)


def _high_frequency_energy(images):
    """Spectral energy above a quarter of the sampling rate (the 1 px checkerboard lives at 0.5)."""
    x = images.astype(float)
    power = np.abs(np.fft.fft2(x - x.mean(axis=(1, 2), keepdims=True))) ** 2
    f = np.fft.fftfreq(x.shape[1])
    return power[:, np.hypot(f[:, None], f[None, :]) > 0.25].sum()


def _domain(images, name):
    steps = domains.build_steps("breastmnist", domains.GPAF_SCENARIO1[name], name)
    return domains.corrupt_images(images, steps, 0, name, "train")


def test_degraded_domain_adds_visible_noise_on_flat_grey():
    """Gaussian noise 0.12 at 28 px: >= 15 grey levels of pixel std (the 224 px round trip left ~2.6)."""
    out = _domain(_flat(), "degraded_medmnistc").astype(float)
    assert out.std(axis=(1, 2)).mean() >= 15
    assert out.mean() > 128 + 20  # brightness x1.3
    assert _domain(_flat(), "clean").tobytes() == _flat().tobytes()


def test_midrange_lower_resolution_removes_fine_detail():
    """pixelate 0.5 is a true 14 px reduction: a 1 px checkerboard loses most of its high-frequency energy."""
    board = _checkerboard()
    assert _high_frequency_energy(_domain(board, "midrange_medmnistc")) < 0.1 * _high_frequency_energy(board)
    assert _high_frequency_energy(_domain(board, "clean")) == _high_frequency_energy(board)
    half = domains.build_steps("breastmnist", [{"corruption": "pixelate", "range": [0.5, 0.5]}], "p")
    out = domains.corrupt_images(board, half, 0, "p", "train")
    assert np.abs(out.astype(float) - board).mean() > 50  # each 2x2 block becomes its mean


def test_large_canvas_round_trip_is_exact():
    """Steps tuned for 224 px run on an integer-enlarged canvas; the resampling alone changes nothing."""
    from PIL import Image

    assert domains.canvas_factor(28) == 8 and domains.canvas_factor(64) == 4 and domains.canvas_factor(224) == 1
    identity = domains.Step(lambda img, seed: np.asarray(img), large_canvas=True)
    rng = np.random.default_rng(0)
    for arr in (rng.integers(0, 256, (28, 28), dtype=np.uint8), rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)):
        img = Image.fromarray(arr)
        assert np.array_equal(np.asarray(domains.apply_step(img, identity, 0)), arr)
    blur = domains.build_steps("breastmnist", [{"preset": "motion_blur", "severity": 3}], "m")
    assert blur[0].large_canvas
    assert not domains.build_steps("breastmnist", domains.GPAF_SCENARIO1["degraded_medmnistc"], "d")[0].large_canvas


def test_domains_hurt_a_model_trained_on_clean_images_only(breast_arrays):
    """The point of Scenario 1: a CNN fitted on the clean client's images loses accuracy on the degraded one."""
    import torch
    import torch.nn.functional as F

    from fedmedbench.models.cnn import SmallCNN

    def tensor(images):
        return torch.tensor(images[:, None] / 255.0, dtype=torch.float32)

    x, y = tensor(breast_arrays["train_images"]), torch.tensor(breast_arrays["train_labels"].ravel(), dtype=torch.long)
    torch.manual_seed(0)
    model = SmallCNN(1, 2, 28)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        for idx in torch.randperm(len(y), generator=g).split(32):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    test, labels = breast_arrays["test_images"], breast_arrays["test_labels"].ravel()

    def accuracy(images):
        with torch.no_grad():
            return float((model(tensor(images)).argmax(1).numpy() == labels).mean())

    clean, degraded = accuracy(test), accuracy(_domain(test, "degraded"))
    assert clean >= 0.8
    assert degraded <= clean - 0.1, (clean, degraded)


def test_profile_is_one_device_per_domain_with_per_image_noise():
    """The authors' client shift: x' = clip(c x + b + sigma eps, 0, 1), c, b, sigma fixed per domain."""
    flat = _flat(40, value=100)
    spec = [{"profile": {"contrast": [0.5, 1.5], "brightness": [0.27, 0.33], "noise": [0.108, 0.132]}}]
    out = domains.corrupt_images(flat, domains.build_steps("breastmnist", spec, "d", seed=3), 3, "d", "train") / 255.0
    rng = np.random.default_rng(domains.domain_seed(3, "d", 0))
    c, b, sigma = rng.uniform([0.5, 0.27, 0.108], [1.5, 0.33, 0.132])
    # one device for every image: each image's mean is c x + b, the pixel spread is sigma (+ 8-bit rounding)
    np.testing.assert_allclose(out.mean(axis=(1, 2)), c * 100 / 255 + b, atol=0.025)
    np.testing.assert_allclose(out.std(axis=(1, 2)), sigma, rtol=0.15)
    assert out.mean(axis=(1, 2)).std() < 0.01  # no per-image contrast or brightness
    assert not np.array_equal(out[0], out[1])  # fresh noise per image
    # brightness is an additive shift on the [0, 1] scale (+0.3 on black), not a factor
    black = domains.corrupt_images(_flat(4, value=0), domains.build_steps("breastmnist", [{"profile": {"brightness": [0.3, 0.3]}}], "k"), 0, "k", "train")
    assert np.all(black == round(0.3 * 255))
    other = domains.build_steps("breastmnist", spec, "d", seed=4)
    assert not np.array_equal(domains.corrupt_images(flat, other, 3, "d", "train"), out * 255)
    with pytest.raises(domains.DomainSpecError, match="profile takes"):
        domains.build_steps("breastmnist", [{"profile": {"gamma": [1, 1]}}], "p")


def test_scenario1_devices_are_the_authors_realised_draws():
    """Clients 1 and 2 get the (c, b, sigma) the authors' seeded draw gives them (seed 42 + client id;
    noise, contrast, brightness in that order), and a flat 204 grey goes to c x + b, not to white."""
    expected = {"midrange": (1.087253231423585, 0.18533563856743954, 0.07384087306223647),
                "degraded": (0.6047961043698697, 0.3146784289007711, 0.1280362115679756)}
    for name, device in expected.items():
        (step,) = domains.build_steps("breastmnist", domains.GPAF_SCENARIO1[name], name, seed=7)
        np.testing.assert_allclose(step.params, device, rtol=0, atol=1e-15)
    assert domains.gpaf_device(0) == (1.0, 0.0, 0.0)  # client 0: high-end, the original images
    out = _domain(_flat(200, value=204), "degraded").astype(float)
    c, b, sigma = expected["degraded"]
    assert abs(out.mean() - 255 * (c * 0.8 + b)) < 2.0  # 203.6 grey (noise clipped above 1 lowers it < 1 level)
    assert (out == 255).mean() < 0.1
    assert abs(out.std() / 255 - sigma) < 0.015
    with pytest.raises(domains.DomainSpecError, match="gpaf_device takes"):
        domains.build_steps("breastmnist", [{"gpaf_device": {"client": "2"}}], "p")


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
    assert diff.std() > 20  # 0.12 x 255 = 30.6 grey levels, less what clipping removes
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


@pytest.mark.parametrize("preset", ["bubble", "stain_deposit"])
def test_microscopy_presets_are_seeded_per_image(preset):
    """medmnistc's microscopy corruptions draw from Python's ``random``: seeded per image like NumPy's, so
    a dataset comes out the same whatever the process drew before, and the caller's state is kept."""
    import random

    from fedmedbench.data import synthetic

    images = synthetic.generate("bloodmnist", 28, seed=0, counts={"train": 6, "val": 1, "test": 1})["train_images"]
    steps = domains.build_steps("bloodmnist", [{"preset": preset, "severity": 3}], "m")
    random.seed(1)
    a = domains.corrupt_images(images, steps, 0, "m", "train")
    assert random.random() == random.Random(1).random()  # the caller's state, as it was
    random.seed(2)
    b = domains.corrupt_images(images, steps, 0, "m", "train")
    assert np.array_equal(a, b) and not np.array_equal(a, images)
    assert np.array_equal(domains.corrupt_images(images[:2], steps, 0, "m", "train"), a[:2])


def test_the_corruptions_that_read_their_own_rng_are_the_ones_given_one():
    """Only corruptors whose code reads ``self.rng`` get a Generator per image (the rest draw from the
    per-image seeded global RNGs); a medmnistc release that adds one must be listed."""
    import inspect

    from fedmedbench import compat

    compat.patch_medmnistc()
    from medmnistc.corruptions import base, registry

    classes = {name: cls for name, cls in vars(registry).items()
               if inspect.isclass(cls) and issubclass(cls, base.BaseCorruption) and cls is not base.BaseCorruption}
    readers = {name for name, cls in classes.items()
               if any("self.rng" in inspect.getsource(k) for k in cls.__mro__ if k.__module__.startswith("medmnistc"))}
    assert len(classes) > 10 and readers == domains.RNG_ATTRIBUTE_READERS
