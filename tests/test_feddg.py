"""FedDG-ELCFS: frequency-space interpolation keeps phase and mixes amplitude; the amplitude bank; episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.clients import client_ctx, fresh_global, server_ctx, toy_data, toy_spec

from fedmedbench.fl.api.arrays import weighted_average
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.methods.feddg import (
    BANK,
    FedDG,
    SpectrumBank,
    amplitude_spectrum,
    interpolate_amplitude,
    low_freq_mask,
)

SPEC = toy_spec("feddg")


def images(n=4, c=1, seed=0):
    return torch.rand(n, c, 28, 28, generator=torch.Generator().manual_seed(seed)) * 255


def test_low_frequency_window_is_centred_and_symmetric():
    m = low_freq_mask(28, 28, 0.05)
    assert int(m.sum()) == 9  # b = floor(28 * 0.05) = 1 -> 3x3 window
    shifted = torch.fft.fftshift(m)
    assert shifted[13:16, 13:16].all() and m[0, 0]  # the DC term sits at (0, 0) unshifted
    assert torch.equal(m, torch.roll(torch.flip(m, (0, 1)), (1, 1), (0, 1)))  # k in window <=> -k in window
    assert int(low_freq_mask(28, 28, 0.0).sum()) == 1  # the reference loader's L = 0: DC only


@pytest.mark.parametrize("window", [0.05, 0.2, 0.5])
def test_interpolation_keeps_phase_and_mixes_amplitude(window):
    x, other = images(4, 3, seed=1), images(4, 3, seed=2)
    target = amplitude_spectrum(other)
    lam = torch.tensor([0.0, 0.3, 0.7, 1.0])
    out = interpolate_amplitude(x, target, lam, window)
    fx, fo = torch.fft.fft2(x.double()), torch.fft.fft2(out.double())
    mask = low_freq_mask(28, 28, window)
    amp_x, amp_o = fx.abs(), fo.abs()
    # amplitude: (1 - lam) * A_local + lam * A_target inside the window, A_local outside
    expected = torch.where(mask, (1 - lam.view(-1, 1, 1, 1)) * amp_x + lam.view(-1, 1, 1, 1) * target.double(), amp_x)
    torch.testing.assert_close(amp_o, expected, rtol=1e-3, atol=1e-2)
    # phase: unchanged wherever the amplitude is not ~0
    keep = (amp_x > 1e-3) & (amp_o > 1e-3)
    dphase = torch.angle(fo * torch.conj(fx))[keep]
    assert dphase.abs().max() < 1e-3
    # lam = 0 returns the image itself; lam = 1 swaps the low-frequency amplitude entirely
    torch.testing.assert_close(out[0], x[0], rtol=0, atol=1e-3)
    assert not torch.allclose(out[3], x[3], atol=1.0)


def test_default_transfer_is_the_reference_loaders_dc_swap():
    """Window 0 and lambda = 1 (the reference loader): only the DC amplitude is replaced, so each
    channel keeps its pattern and takes the target image's mean intensity."""
    method = FedDG()
    assert method.p["window"] == 0.0 and method.p["ratio_range"] == [1.0, 1.0]
    x, other = images(3, 3, seed=3), images(3, 3, seed=4)
    _, lam = method.sample_targets(SpectrumBank.of([amplitude_spectrum(other)]), 3, torch.Generator().manual_seed(0))
    assert torch.equal(lam, torch.ones(3))
    out = interpolate_amplitude(x, amplitude_spectrum(other), lam, method.p["window"])
    expected = x - x.mean(dim=(-2, -1), keepdim=True) + other.mean(dim=(-2, -1), keepdim=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-2)
    # the paper's continuous interpolation (3x3 window at 28 px) changes more than the mean
    paper = interpolate_amplitude(x, amplitude_spectrum(other), torch.ones(3), 0.05)
    assert (paper - expected).abs().max() > 1.0


def test_round_one_shares_spectra_and_server_builds_the_bank():
    method = FedDG(bank_fraction=0.25)
    arrays = fresh_global(method, SPEC)
    datas = [toy_data(64, seed=i) for i in range(3)]
    results = [method.client_fit(client_ctx(method, SPEC, arrays, d, pid=i, steps=2)) for i, d in enumerate(datas)]
    for r in results:
        amp = r.extras["amplitudes"]["amp"]
        assert amp.shape == (16, 1, 28, 28) and (amp >= 0).all()
        assert not any("phase" in k for k in r.extras["amplitudes"])  # phases never leave the client
    ctx = server_ctx(method, SPEC, arrays, results)
    new = method.aggregate(ctx)
    assert sorted(ctx.broadcast[BANK]) == ["client0", "client1", "client2"]
    avg = weighted_average([r.arrays for r in results], [r.num_examples for r in results])
    assert all(np.array_equal(new[k], avg[k]) for k in avg)
    # round 2: nothing is re-sent; the bank offered to client 0 excludes its own spectra
    r2 = method.client_fit(client_ctx(method, SPEC, new, datas[0], pid=0, rnd=2, steps=2, broadcast=ctx.broadcast))
    assert not r2.extras
    bank = method.target_bank(client_ctx(method, SPEC, new, datas[0], pid=0, rnd=2, broadcast=ctx.broadcast),
                              own=np.zeros((1, 1, 28, 28), np.float32))
    own0 = ctx.broadcast[BANK]["client0"]
    spectra = [bank.client(c) for c in range(len(bank))]
    assert len(bank) == 2 and not any(b.shape == own0.shape and np.array_equal(b.numpy(), own0) for b in spectra)


def test_first_round_modes_and_episode_changes_the_update():
    data = toy_data(64)
    arrays = fresh_global(FedDG(), SPEC)
    own = FedDG(first_round="own").client_fit(client_ctx(FedDG(), SPEC, arrays, data, steps=3))
    erm = FedDG(first_round="erm").client_fit(client_ctx(FedDG(), SPEC, arrays, data, steps=3))
    fedavg = get_method("fedavg").client_fit(client_ctx(get_method("fedavg"), SPEC, arrays, data, steps=3))
    # erm (no bank) = plain cross-entropy steps = FedAvg; the episodic outer loss changes the update
    assert all(np.array_equal(erm.arrays[k], fedavg.arrays[k]) for k in erm.arrays)
    assert any(not np.array_equal(own.arrays[k], erm.arrays[k]) for k in own.arrays)


def test_feddg_parameter_errors():
    with pytest.raises(ValueError, match="ratio_range"):
        get_method("feddg", {"ratio_range": [0.5, 0.2]})
    with pytest.raises(ValueError, match="first_round"):
        get_method("feddg", {"first_round": "skip"})
    with pytest.raises(ValueError, match="window"):
        get_method("feddg", {"window": -0.1})
