"""The arithmetic floor of a round for ``grid_cost.py``: the FLOPs of its work at a share of the device's dense peak.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one sample's forward pass through the
project's own model builder; a training sample costs 3 forward passes (forward, and a backward of about twice
the forward), an evaluated sample one. The counter's figure is taken as it is (it counts the matrix products
and convolutions, nothing else, and overcounts a depthwise convolution's backward: a floor, not a prediction).
A round's floor is its FLOPs over ``share`` x the device's dense peak: the GPUs' from :data:`DENSE_PEAK_TFLOPS`
(or ``--peak-tflops``), a CPU's measured as its best fp32 matrix-product rate.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

#: dense peak (TFLOP/s) a card's floor is taken against, by a word in its name: the figure the paper grids'
#: cost estimate took for the H100 (its 30 % = 120 TFLOP/s); the H200 is the same chip with more memory.
#: Not checked here against a datasheet; ``--peak-tflops`` sets another.
DENSE_PEAK_TFLOPS = {"H100": 400.0, "H200": 400.0}
#: the shares of the peak a floor is given at
SHARES = (0.3, 0.1)


def forward_flops(model: torch.nn.Module, example: torch.Tensor) -> int:
    """FLOPs of ``model``'s forward pass on ``example`` (no gradients, eval mode; the model is left as it was)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(example)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


def round_flops(forward: float, train_samples: float, eval_samples: float) -> float:
    """A round's FLOPs: 3 forward passes a training sample, one an evaluated sample."""
    return 3.0 * forward * train_samples + forward * eval_samples


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return f"cpu: {cpu or platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def measured_gemm_flops(size: int = 1024, repeats: int = 3) -> float:
    """This CPU's best fp32 matrix-product rate (FLOP/s) with the process's torch threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def dense_peak(device: str, name: str, override_tflops: float | None = None) -> tuple[float, str]:
    """(FLOP/s, where the figure comes from) of the device the floor is taken against."""
    if override_tflops:
        return float(override_tflops) * 1e12, "--peak-tflops"
    if device == "cuda":
        for word, tflops in DENSE_PEAK_TFLOPS.items():
            if word in name:
                return tflops * 1e12, f"DENSE_PEAK_TFLOPS[{word}]"
        raise SystemExit(f"{name}: no dense peak known for this card (bench/_flop_floor.py); give --peak-tflops")
    return measured_gemm_flops(), "measured fp32 matrix product (1024x1024)"


def floor_fields(flops_per_round: float, peak: float, measured_s_per_round: float | None, round_budget: int) -> dict:
    """The floor's seconds a round, the measured time over it, and the grid's floor in device-hours, at each share."""
    out: dict = {}
    for share in SHARES:
        pct = round(share * 100)
        seconds = flops_per_round / (share * peak)
        out[f"floor_s_per_round_{pct}"] = round(seconds, 4)
        out[f"floor_gpu_hours_{pct}"] = round(seconds * round_budget / 3600, 4)
        if measured_s_per_round is not None and seconds > 0:
            out[f"measured_over_floor_{pct}"] = float(f"{measured_s_per_round / seconds:.3g}")
    return out
