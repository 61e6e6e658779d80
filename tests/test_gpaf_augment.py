"""Client augmentation as the GPAF authors' loader (fl/augment.py, ``client_augmentation``).

The reference is sanywright13/GPAFflower baselines/fedprox/fedprox/dataset_preparation.py at c2505a7:
``BreastMnistDataset.__getitem__`` (:302-322) shifts each read with ``SameModalityDomainShift.apply_transform``
(:117-131, fresh ``torch.randn_like`` noise at every call) and then applies ``buid_domain_transform`` (:37-43:
RandomHorizontalFlip(0.5), RandomRotation(45), RandomApply([GaussianBlur((5, 9), (0.1, 5))], 0.5),
Normalize(0.5, 0.5)), to the clients' training and validation shares (dataset.py:88-108).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedmedbench.data.domains import CLEAN_DEVICE, DomainSpecError, device_of, gpaf_device
from fedmedbench.fl.api import ClientData
from fedmedbench.fl.augment import (
    CLIENT_AUGMENTATIONS,
    batch_images,
    device_shift,
    gaussian_blur,
    gaussian_kernel1d,
    hflip,
    reference_batch,
    rotate,
)
from fedmedbench.fl.training import to_float

ROOT = Path(__file__).resolve().parents[1]


def asymmetric_image() -> torch.Tensor:
    """5 x 5, one bright pixel in the top row, middle column, another at row 1, column 3."""
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 0, 2] = 1.0
    x[0, 0, 1, 3] = 0.5
    return x


def test_flip_mirrors_left_to_right_only_where_drawn():
    x = asymmetric_image().repeat(2, 1, 1, 1)
    out = hflip(x, torch.tensor([True, False]))
    assert out[0, 0, 1, 1] == 0.5 and out[0, 0, 1, 3] == 0.0 and out[0, 0, 0, 2] == 1.0
    assert torch.equal(out[1], x[1])


def test_rotation_is_counter_clockwise_about_the_centre_with_zero_fill():
    x = asymmetric_image()
    quarter = rotate(x, torch.tensor([90.0], dtype=torch.float64))[0, 0]
    expected = torch.zeros(5, 5)
    expected[2, 0] = 1.0  # top middle -> left middle
    expected[1, 1] = 0.5  # (row 1, col 3) -> (row 1, col 1)
    assert torch.equal(quarter, expected)
    corner = torch.zeros(1, 1, 5, 5)
    corner[0, 0, 0, 0] = 1.0
    # a 45 degree turn carries the corner pixel outside the image: nothing comes back, nothing lands inside
    assert rotate(corner, torch.tensor([45.0], dtype=torch.float64)).sum() == 0
    assert torch.equal(rotate(x, torch.tensor([0.0], dtype=torch.float64)), x)


def test_blur_kernel_is_the_normalised_gaussian_of_the_drawn_sigma():
    k = gaussian_kernel1d(5, torch.tensor([1.0], dtype=torch.float64))[0]
    w = np.exp(-0.5 * np.arange(-2, 3) ** 2)
    np.testing.assert_allclose(k.numpy(), w / w.sum(), rtol=1e-12)
    flat = torch.full((1, 1, 6, 6), 0.25)
    assert torch.allclose(gaussian_blur(flat, torch.tensor([3.0])), flat)  # weights sum to 1, reflect padding
    impulse = torch.zeros(1, 1, 11, 11)
    impulse[0, 0, 5, 5] = 1.0
    out = gaussian_blur(impulse, torch.tensor([1.0]))[0, 0]
    # 5 wide x 9 high: the spread reaches 2 columns and 4 rows from the centre
    assert out[5, 3] > 0 and out[5, 2] == 0 and out[1, 5] > 0 and out[0, 5] == 0


def test_transforms_equal_torchvisions_at_the_same_draws():
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    x = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    angles = torch.tensor([-45.0, -12.7, 30.1, 45.0], dtype=torch.float64)
    sigmas = torch.tensor([0.1, 0.9, 2.6, 5.0], dtype=torch.float64)
    rotated, blurred = rotate(x, angles), gaussian_blur(x, sigmas)
    for i in range(4):
        assert torch.equal(rotated[i], TF.rotate(x[i], float(angles[i]), interpolation=InterpolationMode.NEAREST, fill=[0.0]))
        assert torch.allclose(blurred[i], TF.gaussian_blur(x[i], [5, 9], [float(sigmas[i])] * 2), atol=1e-7)
        assert torch.equal(hflip(x[i : i + 1], torch.tensor([True]))[0], TF.hflip(x[i]))


def test_device_shift_is_contrast_brightness_noise_then_one_clamp():
    x = torch.tensor([0.0, 0.5, 0.8, 1.0]).view(1, 1, 2, 2)
    eps = torch.tensor([1.0, -1.0, 0.0, 2.0]).view(1, 1, 2, 2)
    out = device_shift(x, torch.tensor([[0.605, 0.315, 0.128]]), eps)[0, 0].flatten()
    expected = [0.315 + 0.128, 0.605 * 0.5 + 0.315 - 0.128, 0.605 * 0.8 + 0.315, 1.0]  # last: 0.92 + 0.256 -> 1
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    clean = device_shift(x, torch.tensor([CLEAN_DEVICE]), eps)
    assert torch.equal(clean, x)


def client(aug: bool, n: int = 6) -> ClientData:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=gen)
    y = torch.arange(n) % 2
    extra = {"aug_x": x.clone(), "aug_device": torch.tensor([gpaf_device(2)], dtype=torch.float32).repeat(n, 1)} if aug else {}
    return ClientData(x, y, x[:2], y[:2], x[:2], y[:2], **extra)


def test_the_same_item_read_twice_gets_new_noise_only_with_the_option():
    idx = torch.tensor([1, 4])
    gen = torch.Generator().manual_seed(7)
    on = client(True)
    first, second = batch_images(on, idx, torch.device("cpu"), gen), batch_images(on, idx, torch.device("cpu"), gen)
    assert not torch.equal(first, second)
    assert first.min() >= -1.0 and first.max() <= 1.0
    off = client(False)
    state = gen.get_state()
    a, b = batch_images(off, idx, torch.device("cpu"), gen), batch_images(off, idx, torch.device("cpu"), gen)
    assert torch.equal(a, b) and torch.equal(a, to_float(off.train_x[idx], torch.device("cpu")))
    assert torch.equal(gen.get_state(), state)  # off draws nothing: the client's other draws are unchanged


def test_the_seed_fixes_every_draw():
    data, idx = client(True), torch.tensor([0, 2, 3, 5])
    reads = [batch_images(data, idx, torch.device("cpu"), torch.Generator().manual_seed(s)) for s in (11, 11, 12)]
    assert torch.equal(reads[0], reads[1])
    assert not torch.equal(reads[0], reads[2])


def test_noise_redrawn_per_read_has_the_devices_sigma():
    """Flat grey through client 2's device: brightness and contrast move the mean, the noise has sigma 0.128."""
    c, b, sigma = gpaf_device(2)
    x = torch.full((64, 1, 28, 28), 102, dtype=torch.uint8)  # 0.4 on the [0, 1] scale
    rows = torch.tensor([[c, b, sigma]], dtype=torch.float32).repeat(64, 1)
    gen = torch.Generator().manual_seed(0)
    shifted = device_shift(x.float() / 255, rows, torch.randn(x.shape, generator=gen))
    assert abs(float(shifted.mean()) - (c * 0.4 + b)) < 2e-3
    assert abs(float(shifted.std()) - sigma) < 2e-3
    # the full read: the centre pixel never leaves the image under a rotation, so it keeps the device's statistics
    read = reference_batch(x, rows, torch.device("cpu"), gen)
    centre = (read[:, 0, 14, 14] + 1) / 2
    assert abs(float(centre.mean()) - (c * 0.4 + b)) < 0.05


def test_device_of_a_domain_is_the_device_its_stored_file_was_made_with():
    assert device_of([], "clean") == CLEAN_DEVICE
    assert device_of([{"gpaf_device": {"client": 1}}], "midrange") == pytest.approx(gpaf_device(1))
    c, b, sigma = device_of([{"profile": {"contrast": [0.6, 1.4], "brightness": [0.18, 0.22], "noise": [0.072, 0.088]}}],
                            "midrange_profile", seed=3)
    assert 0.6 <= c <= 1.4 and 0.18 <= b <= 0.22 and 0.072 <= sigma <= 0.088
    with pytest.raises(DomainSpecError, match=r"domain 'degraded_medmnistc': .*\(client_augmentation: reference or "
                                              r"reference_train\) needs a domain of one gpaf_device or profile step"):
        device_of([{"corruption": "gaussian_noise", "range": [0.12, 0.12]}], "degraded_medmnistc")


def hand_made_run(tmp_path) -> tuple[dict, dict, dict]:
    """Base and 'degraded' files (the stored shift a stand-in: 255 - x), a partition of two clients: (base arrays,
    shifted arrays, sources); the partition is ``tmp_path / 'p.json'``."""
    from fedmedbench.partition.schemes import seal
    from fedmedbench.workflow.io import write_json

    rng = np.random.default_rng(0)
    base = {f"{s}_images": rng.integers(0, 256, (n, 8, 8), dtype=np.uint8) for s, n in (("train", 6), ("val", 2), ("test", 2))}
    base.update({f"{s}_labels": np.arange(n) % 2 for s, n in (("train", 6), ("val", 2), ("test", 2))})
    shifted = {k: (255 - v if k.endswith("images") else v) for k, v in base.items()}  # a stand-in for the stored shift
    np.savez(tmp_path / "base.npz", **base)
    np.savez(tmp_path / "degraded.npz", **shifted)
    doc = {"num_classes": 2, "clients": [
        {"id": 0, "source": "base", "train": [0, 1, 2], "val": [6], "test": [8]},
        {"id": 1, "source": "degraded", "train": [3, 4, 5], "val": [7], "test": [9]}],
        "global_test": [{"source": "base", "idx": [8, 9]}]}
    write_json(tmp_path / "p.json", seal(doc))
    sources = {"base": str(tmp_path / "base.npz"), "degraded": str(tmp_path / "degraded.npz")}
    return base, shifted, sources


def augmentation(mode: str) -> dict:
    return {"mode": mode, "domains": {"degraded": [{"gpaf_device": {"client": 2}}]}, "domain_seed": 0}


def test_federated_data_reads_clean_training_images_and_keeps_stored_validation(tmp_path):
    from fedmedbench.fl.data import FederatedData

    base, shifted, sources = hand_made_run(tmp_path)
    aug = augmentation("reference")
    data = FederatedData(tmp_path / "p.json", sources, aug)
    degraded = data.client(1)
    assert np.array_equal(degraded.train_x[:, 0].numpy(), shifted["train_images"][3:6])  # the stored shift stays
    assert np.array_equal(degraded.aug_x[:, 0].numpy(), base["train_images"][3:6])  # the clean image to shift per read
    assert np.array_equal(degraded.val_x[:, 0].numpy(), shifted["val_images"][1:2])
    np.testing.assert_allclose(degraded.aug_device.numpy(), np.tile(gpaf_device(2), (3, 1)), rtol=1e-6)
    np.testing.assert_array_equal(data.client(0).aug_device.numpy(), np.tile(CLEAN_DEVICE, (3, 1)))
    pooled = data.pooled()
    assert pooled.aug_x.shape[0] == pooled.train_x.shape[0] == pooled.aug_device.shape[0] == 6
    plain = FederatedData(tmp_path / "p.json", sources).client(1)
    assert plain.aug_x is None and plain.aug_device is None
    with pytest.raises(ValueError, match="'base' source"):
        FederatedData(tmp_path / "p.json", {"degraded": sources["degraded"]}, aug)
    reordered = {k: v[::-1].copy() for k, v in shifted.items()}  # the images and labels of another pool order
    np.savez(tmp_path / "reordered.npz", **reordered)
    with pytest.raises(ValueError, match="reordered.npz: its labels are not those of the clean 'base' file"):
        FederatedData(tmp_path / "p.json", {**sources, "degraded": str(tmp_path / "reordered.npz")}, aug).client(1)
    with pytest.raises(ValueError, match=r"client_augmentation\.mode = 'refrence'"):  # a typo is refused, not read as on
        FederatedData(tmp_path / "p.json", sources, {**aug, "mode": "refrence"})
    no_domains = {k: v for k, v in aug.items() if k != "domains"}  # a run spec written by hand
    with pytest.raises(ValueError, match=r"^run spec client_augmentation\.domains = None: give a mapping"):
        FederatedData(tmp_path / "p.json", sources, no_domains)
    with pytest.raises(ValueError, match=r"^run spec client_augmentation\.domains = \['degraded'\]"):
        FederatedData(tmp_path / "p.json", sources, {**aug, "domains": ["degraded"]})
    # the validation shares before their shift, client by client as global_val pools them, with their devices
    clean_val, rows = data.global_val_reads()
    assert np.array_equal(clean_val[:, 0].numpy(), base["val_images"][[0, 1]])
    np.testing.assert_allclose(rows.numpy(), [CLEAN_DEVICE, gpaf_device(2)], rtol=1e-6)
    assert FederatedData(tmp_path / "p.json", sources, augmentation("reference_train")).global_val_reads() is None
    assert FederatedData(tmp_path / "p.json", sources).global_val_reads() is None
    # a client validating its own model reads its share the same way under reference only
    assert np.array_equal(degraded.val_aug_x[:, 0].numpy(), base["val_images"][1:2])
    assert FederatedData(tmp_path / "p.json", sources, augmentation("reference_train")).client(1).val_aug_x is None


def test_client_validation_reads_its_share_from_the_clients_generator(tmp_path):
    from fedmedbench.fl.data import FederatedData
    from fedmedbench.fl.tasks.classification import ClassificationTask
    from fedmedbench.models import build_model

    _, _, sources = hand_made_run(tmp_path)
    torch.manual_seed(0)
    model = build_model("gpaf_cnn", in_channels=1, num_classes=2, image_size=8)
    on = FederatedData(tmp_path / "p.json", sources, augmentation("reference")).client(1)
    cpu = torch.device("cpu")

    def loss(data: ClientData, seed: int | None) -> float:
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        return ClassificationTask.evaluate_validation(model, data, cpu, 4, generator=gen)["loss"]

    assert loss(on, 1) == loss(on, 1) and loss(on, 1) != loss(on, 2)
    stored = FederatedData(tmp_path / "p.json", sources, augmentation("reference_train")).client(1)
    assert loss(stored, 1) == loss(stored, 2) == loss(stored, None)
    with pytest.raises(ValueError, match="generator"):
        loss(on, None)


@pytest.mark.parametrize("mode", ["reference", "reference_train", "none"])
def test_server_validation_reads_fresh_images_per_round_only_under_reference(tmp_path, mode):
    """reference: each round's validation is a new read of the clean shares (repeatable for that round);
    reference_train and none: the stored shares, the same metrics every round."""
    from fedmedbench.fl.spec import RunSpec
    from fedmedbench.fl.tasks.classification import ClassificationTask
    from fedmedbench.models import build_model

    _, _, sources = hand_made_run(tmp_path)
    spec = RunSpec(run_dir="unused", study="t", dataset="breastmnist", setting="s", method="fedavg", seed=3,
                   partition_path=str(tmp_path / "p.json"), sources=sources, image_size=8, in_channels=1, num_classes=2,
                   model="gpaf_cnn", train={"rounds": 2, "local_epochs": 1, "batch_size": 4, "lr": 0.01},
                   client_augmentation=None if mode == "none" else augmentation(mode))
    torch.manual_seed(0)
    model = build_model("gpaf_cnn", in_channels=1, num_classes=2, image_size=8)
    task = ClassificationTask(spec)

    def val_loss(rnd: int) -> float:
        task.set_eval_round(rnd)
        return task.evaluate_global(model, torch.device("cpu"))[0]["val_loss"]

    first, again, later = val_loss(1), val_loss(1), val_loss(2)
    assert first == again
    assert (first != later) if mode == "reference" else (first == later)


def test_a_float_read_is_evaluated_as_it_is():
    from fedmedbench.fl.training import predict_samples
    from fedmedbench.models import build_model

    torch.manual_seed(0)
    model = build_model("gpaf_cnn", in_channels=1, num_classes=2, image_size=8)
    x = torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8)
    y = torch.tensor([0, 1, 0, 1, 1])
    as_u8 = predict_samples(model, x, y, 2, torch.device("cpu"))
    as_float = predict_samples(model, to_float(x, torch.device("cpu")), y, 2, torch.device("cpu"))
    assert all(np.array_equal(a, b) for a, b in zip(as_u8, as_float, strict=True))


def test_validation_reads_are_fixed_by_run_seed_and_round():
    from fedmedbench.fl.augment import read_all, validation_generator

    x = torch.randint(0, 256, (7, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([gpaf_device(1)]).repeat(7, 1)
    one = read_all(x, rows, validation_generator(0, 4), batch_size=3)
    assert torch.equal(one, read_all(x, rows, validation_generator(0, 4), batch_size=3))
    assert not torch.equal(one, read_all(x, rows, validation_generator(0, 5), batch_size=3))
    assert not torch.equal(one, read_all(x, rows, validation_generator(1, 4), batch_size=3))


@pytest.mark.parametrize("name", ["fedavg", "moon", "feddg", "gpaf", "centralized", "local"])
def test_methods_train_on_the_augmented_reads_and_stay_repeatable(name):
    """With the option on a client's update depends on its clean images (not the stored ones) and is the
    same for the same generator seed; off, it is the update of the stored images."""
    from dataclasses import replace

    from helpers.clients import client_ctx, fresh_global, toy_data, toy_spec

    from fedmedbench.fl.api.registry import get_method

    method = get_method(name)
    spec = toy_spec(name, model="gpaf_cnn_moon" if name == "moon" else "gpaf_cnn")
    arrays = fresh_global(method, spec)
    off = toy_data(24)
    on = replace(off, aug_x=off.train_x.clone(), aug_device=torch.tensor([gpaf_device(2)]).repeat(24, 1))
    other_clean = replace(on, aug_x=255 - on.aug_x)

    def update(data: ClientData) -> torch.Tensor:
        ctx = client_ctx(method, spec, arrays, data, steps=2)
        method.client_fit(ctx)  # every one of these trains ctx.model in place
        return torch.cat([v.flatten().float() for v in ctx.model.state_dict().values()])

    assert torch.equal(update(on), update(on))
    assert not torch.equal(update(on), update(other_clean))
    assert not torch.equal(update(on), update(off))


def test_option_names_are_the_schemas():
    import yaml

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    study = schema["definitions"]["study"]["properties"]["client_augmentation"]
    assert tuple(study["enum"]) == CLIENT_AUGMENTATIONS and study["default"] == "none"
    assert tuple(schema["definitions"]["setting"]["properties"]["client_augmentation"]["enum"]) == CLIENT_AUGMENTATIONS


def test_paper_grid_augments_scenario_1_only():
    import yaml

    grid = yaml.safe_load((ROOT / "config" / "studies" / "gpaf.yaml").read_text())["studies"]
    assert grid["gpaf"]["client_augmentation"] == "reference"
    assert grid["gpaf_pathmnist"]["client_augmentation"] == "none"
    assert math.isclose(gpaf_device(2)[2], 0.128, abs_tol=5e-4)


def test_reference_draws_flip_then_rotation_then_blur_with_the_authors_probabilities_and_ranges(monkeypatch):
    """torchvision's transforms as ``buid_domain_transform`` composes them (:37-43): the flip (p 0.5) first,
    then the rotation (angle ~ U(-45, 45)), then the blur (p 0.5, sigma ~ U(0.1, 5)); each primitive is
    replaced by a recorder, so the draws and the order are read off directly."""
    import fedmedbench.fl.augment as augment

    calls: list[tuple[str, torch.Tensor]] = []
    monkeypatch.setattr(augment, "hflip", lambda x, flip: (calls.append(("flip", flip)), x + 1.0)[1])
    monkeypatch.setattr(augment, "rotate", lambda x, deg: (calls.append(("rotate", deg)), x * 10.0)[1])
    monkeypatch.setattr(augment, "gaussian_blur", lambda x, sigma: (calls.append(("blur", sigma)), x - 1000.0)[1])
    n = 20000
    out = augment.reference_transform(torch.zeros(n, 1, 2, 2), torch.Generator().manual_seed(5))
    assert [name for name, _ in calls] == ["flip", "rotate", "blur"]
    flip, angle, sigma = (c[1].double() for c in calls)
    blurred = (out[:, 0, 0, 0] < 0).double()  # the blur's mark, only where it was drawn
    assert torch.equal(out[blurred == 0], torch.full((int(n - blurred.sum()), 1, 2, 2), 10.0))
    for drawn in (flip, blurred):
        assert abs(float(drawn.mean()) - 0.5) < 0.02
    for values, lo, hi in ((angle, -45.0, 45.0), (sigma, 0.1, 5.0)):
        assert lo <= float(values.min()) < lo + 0.1 and hi - 0.1 < float(values.max()) <= hi
        assert abs(float(values.mean()) - (lo + hi) / 2) < 0.02 * (hi - lo)
        assert abs(float(values.std()) - (hi - lo) / math.sqrt(12)) < 0.02 * (hi - lo)


def test_a_read_is_the_transform_of_the_shifted_image_then_normalize_half_half(monkeypatch):
    """``__getitem__`` order: x / 255, the device shift, the transforms, Normalize(0.5, 0.5) last."""
    import fedmedbench.fl.augment as augment

    seen = {}

    def transform(x01, generator):
        seen["x"] = x01.clone()
        return x01

    monkeypatch.setattr(augment, "reference_transform", transform)
    x = torch.tensor([0, 51, 204, 255], dtype=torch.uint8).view(1, 1, 2, 2)
    out = augment.reference_batch(x, torch.tensor([[0.5, 0.1, 0.0]]), torch.device("cpu"), torch.Generator().manual_seed(0))
    shifted = torch.tensor([0.1, 0.2, 0.5, 0.6]).view(1, 1, 2, 2)  # 0.5 x + 0.1 of 0, 0.2, 0.8, 1
    assert torch.allclose(seen["x"], shifted, atol=1e-6)
    assert torch.allclose(out, shifted * 2 - 1, atol=1e-6)


def test_a_profile_domains_device_is_the_one_its_stored_file_applies():
    """Noise off, the stored file of flat images is round(255 (c x + b)): the (c, b) ``device_of`` gives for the same
    domain seed, and not those of another seed (a profile draws its device from ``domain_seed``)."""
    from fedmedbench.data.domains import corrupt_dataset

    spec = [{"profile": {"contrast": [0.6, 1.4], "brightness": [0.1, 0.3], "noise": [0.0, 0.0]}}]
    flat = {f"{s}_images": np.full((2, 4, 4), 102, dtype=np.uint8) for s in ("train", "val", "test")}
    flat.update({f"{s}_labels": np.zeros((2, 1), dtype=np.int64) for s in ("train", "val", "test")})
    stored = corrupt_dataset(flat, "breastmnist", "midrange_profile", spec, seed=5)["train_images"]
    c, b, sigma = device_of(spec, "midrange_profile", seed=5)
    assert sigma == 0.0 and np.all(stored == round(255 * (c * 0.4 + b)))
    c6, b6, _ = device_of(spec, "midrange_profile", seed=6)
    assert round(255 * (c6 * 0.4 + b6)) != stored[0, 0, 0]


def test_feddg_takes_the_augmented_read_onto_the_pixel_scale_and_back():
    """FedDG's amplitude transfer works on 8-bit pixels: an augmented read x in [-1, 1] is (x + 1) 127.5 there, and
    to_model_scale brings it back to x; without the option it is the stored pixels themselves."""
    from fedmedbench.fl.methods.feddg import pixel_scale, to_model_scale

    idx, cpu = torch.tensor([1, 4]), torch.device("cpu")
    on = client(True)
    x = batch_images(on, idx, cpu, torch.Generator().manual_seed(2))
    pixels = pixel_scale(on, idx, x, cpu)
    assert torch.allclose(pixels, (x + 1.0) * 127.5) and not torch.equal(pixels, on.train_x[idx].float())
    assert torch.allclose(to_model_scale(pixels), x, atol=1e-6)
    off = client(False)
    assert torch.equal(pixel_scale(off, idx, to_float(off.train_x[idx], cpu), cpu), off.train_x[idx].float())
