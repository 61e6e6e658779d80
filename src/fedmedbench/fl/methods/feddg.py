"""FedDG-ELCFS (Liu, Chen, Qin, Dou, Heng, CVPR 2021), adapted from segmentation to classification.

Amplitude bank (privacy: phase spectra, which carry the semantics, never leave a client):
the first time a client trains it shares the amplitude spectra |FFT2(x)| of a random
subset of its training images (``bank_fraction``, at most ``bank_max``; the reference
code shares 1/8) as the extra record ``amplitudes``; the server keeps them per client in
the broadcast ``amp_bank``, which every client receives from the next round on.

Client, every mini-batch (x, y):

1. Frequency-space transfer: for each image a target spectrum A_n is drawn from another
   client's bank (random client, then random spectrum) and lambda ~ U(ratio_range); inside
   the centred low-frequency window of half-size floor(min(H, W) * window) the amplitude
   becomes (1 - lambda) * A_local + lambda * A_n (outside it stays A_local), the phase stays
   the local one, and x_t = IFFT2(A' e^{iP}) clipped to the pixel range. Defaults follow the
   reference training loader (liuquande/FedDG-ELCFS dataloaders/fundus_dataloader.py:56,
   253-275): ``window`` 0 (L = 0: the DC term only) and ``ratio_range`` [1, 1] (the target
   amplitude replaces the local one; the loader's random ratio is computed but its
   interpolation line is commented out). The paper's continuous interpolation is
   ``window: 0.05, ratio_range: [0, 1]`` (a 3x3 window at 28 px, the window of the
   reference demo, L = 0.003 at 384 px, freq_space_interpolation_demo.py:22-37, 92).
2. Episodic meta-learning: meta-train loss L_in = CE(f(x; theta), y); inner update
   theta' = theta - meta_step * clip(grad L_in, +-grad_clip_inner) (first order, as the
   reference code: no second derivatives unless ``second_order``); meta-test loss
   L_out = CE(f(x_t; theta'), y); one optimiser step on L_in + L_out.

Dropped: the paper's boundary-oriented episodic contrastive loss needs segmentation
masks (object boundary vs background features) and has no classification counterpart.

Round 1 (empty bank; also later if no other client has shared yet): ``first_round: own``
(default) runs the same episode with the client's own spectra (intra-client
interpolation), ``erm`` trains on L_in alone. The reference precomputes every client's
spectra before training (fundus_dataloader.py:24-28), so its clients use the others' from
the first iteration; here spectra travel with a client's first reply (a deviation: there is
no exchange before round 1). Server: FedAvg.

Defaults: reference code meta_step 1e-3 and inner gradient clip 100 (train_ELCFS.py:36-37,
221); window and ratio as the reference loader (see 1.).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedmedbench.fl.api.arrays import weighted_average
from fedmedbench.fl.api.method import (
    Arrays,
    ClientContext,
    ClientData,
    ClientResult,
    Method,
    Param,
    ServerContext,
)
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.augment import batch_images
from fedmedbench.fl.training import (
    StepLosses,
    batch_indices,
    index_device,
    make_optimizer,
    optimizer_step,
    to_device,
)

BANK = "amp_bank"
# ----------------------------------------------------------------------------- frequency space


def low_freq_mask(h: int, w: int, window: float, device: torch.device | None = None) -> torch.Tensor:
    """Boolean (h, w) mask of the centred low-frequency square, in unshifted FFT layout."""
    b = int(np.floor(min(h, w) * window))
    ch, cw = h // 2, w // 2
    mask = torch.zeros(h, w, dtype=torch.bool, device=device)
    mask[max(ch - b, 0) : ch + b + 1, max(cw - b, 0) : cw + b + 1] = True
    return torch.fft.ifftshift(mask)


def amplitude_spectrum(x: torch.Tensor) -> torch.Tensor:
    """|FFT2| per channel of images (N, C, H, W) on the pixel scale."""
    return torch.fft.fft2(x.float()).abs()


def interpolate_amplitude(x: torch.Tensor, amp_target: torch.Tensor, lam: torch.Tensor, window: float) -> torch.Tensor:
    """Keep x's phase; mix its low-frequency amplitude with ``amp_target`` by ``lam`` (per image)."""
    f = torch.fft.fft2(x.float())
    amp, phase = f.abs(), f.angle()
    mask = low_freq_mask(x.shape[-2], x.shape[-1], window, x.device)
    lam = lam.to(x.device, non_blocking=True).view(-1, 1, 1, 1)
    mixed = torch.where(mask, (1 - lam) * amp + lam * amp_target.to(x.device, non_blocking=True), amp)
    return torch.fft.ifft2(torch.polar(mixed, phase)).real


def to_model_scale(x_pixels: torch.Tensor) -> torch.Tensor:
    """Pixel-scale floats -> [-1, 1] like ``to_float`` (after clipping to the 8-bit range)."""
    return x_pixels.clamp(0, 255).div(127.5).sub(1.0)


def pixel_scale(data: ClientData, idx: torch.Tensor, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The batch on the 8-bit pixel scale for the amplitude transfer: the stored images themselves, or the
    augmented read ``x`` (``client_augmentation: reference``) mapped back from [-1, 1]."""
    if data.aug_x is None:
        return data.train_x[idx].to(device, non_blocking=True).float()
    return (x + 1.0) * 127.5


@dataclass
class SpectrumBank:
    """The amplitude spectra a client draws its targets from, stacked in one tensor (where the broadcast
    is: where the job keeps its arrays), ``sizes[c]`` rows for the c-th client, in client order."""

    spectra: torch.Tensor
    sizes: list[int]

    @classmethod
    def of(cls, per_client: list[torch.Tensor]) -> SpectrumBank:
        return cls(torch.cat(per_client), [int(t.shape[0]) for t in per_client])

    def __len__(self) -> int:
        return len(self.sizes)

    def client(self, c: int) -> torch.Tensor:
        start = sum(self.sizes[:c])
        return self.spectra[start : start + self.sizes[c]]


# ----------------------------------------------------------------------------- method


@register_method("feddg")
class FedDG(Method):
    extra_records = ("amplitudes",)
    #: batches are indexed wherever the client's data is (the engine may keep it on the device)
    device_data = True

    params = (
        Param("bank_fraction", float, 0.125, "share of a client's training images whose spectra it shares",
              low=0, high=1, low_open=True),
        Param("bank_max", int, 256, "most spectra a client shares", low=1),
        Param("window", float, 0.0, "half-size of the low-frequency window, as a fraction of the side", low=0, high=0.5),
        Param("ratio_range", list, [1.0, 1.0], "[lo, hi] of the interpolation ratio lambda, 0 <= lo <= hi <= 1"),
        Param("meta_step", float, 1e-3, "inner (meta-train) step size", low=0, low_open=True),
        Param("grad_clip_inner", float, 100.0, "clip of the inner gradient", low=0, low_open=True),
        Param("second_order", bool, False, "differentiate through the inner step"),
        Param("first_round", str, "own", "round 1 with the client's own spectra, or plain ERM", choices=("own", "erm")),
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        ratio = self.p["ratio_range"]
        if len(ratio) != 2 or not 0 <= ratio[0] <= ratio[1] <= 1:
            raise ValueError(f"method_params.feddg.ratio_range must be [lo, hi] with 0 <= lo <= hi <= 1, got {ratio}")

    @staticmethod
    def key(pid: int) -> str:
        return f"client{pid}"

    @staticmethod
    def aux_generator(ctx: ClientContext) -> torch.Generator:
        """FedDG's own random stream (spectra, targets, lambdas), derived from the client's seed without
        consuming ``ctx.generator``: mini-batches are drawn exactly as FedAvg draws them."""
        return torch.Generator().manual_seed((ctx.generator.initial_seed() ^ 0xFEDD6) % 2**63)

    def shared_spectra(self, ctx: ClientContext, generator: torch.Generator) -> torch.Tensor:
        """Amplitude spectra (float32) of a random subset of the client's training images (what it shares),
        computed on the CPU wherever the client's data is kept, so the bank has the same bits either way."""
        n = ctx.data.num_train
        k = max(1, min(int(self.p["bank_max"]), int(round(n * self.p["bank_fraction"]))))
        idx = torch.randperm(n, generator=generator)[:k]
        return amplitude_spectrum(ctx.data.train_x[idx].cpu()).to(torch.float32)

    def target_bank(self, ctx: ClientContext, own: torch.Tensor) -> SpectrumBank | None:
        """Other clients' spectra, the own ones in round 1, or None (plain ERM)."""
        bank = ctx.broadcast.get(BANK, {})
        others = [v for k, v in sorted(bank.items()) if k != self.key(ctx.pid)]
        if others:
            return SpectrumBank.of(others)
        return SpectrumBank.of([own]) if self.p["first_round"] == "own" else None

    def sample_targets(self, bank: SpectrumBank, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(amplitude targets, lambdas) for n images: a random client, then a random spectrum of it (drawn
        on the CPU, one after the other; the spectra are gathered where the bank is, by one index)."""
        clients = torch.randint(len(bank), (n,), generator=generator)
        starts = np.cumsum([0, *bank.sizes[:-1]])
        rows = [int(starts[c]) + int(torch.randint(bank.sizes[c], (1,), generator=generator)[0]) for c in clients.tolist()]
        targets = bank.spectra[torch.tensor(rows).to(bank.spectra.device, non_blocking=True)]
        lo, hi = self.p["ratio_range"]
        lam = lo + (hi - lo) * torch.rand(n, generator=generator)
        return targets, lam

    def episode_loss(self, model: nn.Module, x: torch.Tensor, x_t: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """L_in + L_out: meta-train on x, inner step, meta-test on x_t with the fast weights."""
        loss_in = F.cross_entropy(model(x), y)
        if x_t is None:
            return loss_in
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(loss_in, list(params.values()), create_graph=self.p["second_order"],
                                    retain_graph=True, allow_unused=True)
        clip, step = self.p["grad_clip_inner"], self.p["meta_step"]
        fast = {n: p if g is None else p - step * g.clamp(-clip, clip) for (n, p), g in zip(params.items(), grads, strict=True)}
        loss_out = F.cross_entropy(functional_call(model, {**fast, **dict(model.named_buffers())}, (x_t,)), y)
        return loss_in + loss_out

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        aux = self.aux_generator(ctx)
        own = self.shared_spectra(ctx, aux)
        bank = self.target_bank(ctx, own)
        model, cfg, device = to_device(ctx.model, ctx.device).train(), ctx.train, ctx.device
        opt = make_optimizer(model, cfg, ctx.rnd)
        losses = StepLosses(ctx.steps_per_epoch())  # read once after the last step: no host sync per step
        for idx in batch_indices(ctx.data.num_train, cfg.batch_size, ctx.steps, ctx.generator,
                                 index_device(ctx.data.train_x, ctx.data.train_y)):
            y = ctx.data.train_y[idx].to(device, non_blocking=True)
            x = batch_images(ctx.data, idx, device, ctx.generator)
            x_t = None
            if bank is not None:
                targets, lam = self.sample_targets(bank, len(idx), aux)
                x_t = to_model_scale(interpolate_amplitude(pixel_scale(ctx.data, idx, x, device), targets, lam,
                                                           self.p["window"]))
            opt.zero_grad(set_to_none=True)
            loss = self.episode_loss(model, x, x_t, y)
            optimizer_step(loss, model, opt, cfg)
            losses.add(loss)
        train_loss = losses.mean(ctx.rnd, what="FedDG", hint="lower train.lr or enable train.grad_clip")
        extras = {}
        if self.key(ctx.pid) not in ctx.broadcast.get(BANK, {}):
            extras["amplitudes"] = {"amp": own}
        return ClientResult(arrays=ctx.result_arrays(model), num_examples=ctx.data.num_train,
                            metrics={"train_loss": train_loss, **losses.epoch_metrics()}, extras=extras)

    def aggregate(self, ctx: ServerContext) -> Arrays:
        bank = dict(ctx.broadcast.get(BANK, {}))
        for pid, r in zip(ctx.pids, ctx.results, strict=True):
            if "amplitudes" in r.extras:
                bank[self.key(pid)] = r.extras["amplitudes"]["amp"]
        ctx.broadcast[BANK] = bank
        return weighted_average([r.arrays for r in ctx.results], [r.num_examples for r in ctx.results])
