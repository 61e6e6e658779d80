"""Small helpers shared by the GPAF-study methods (gpaf, moon, feddg)."""

from __future__ import annotations

import torch
from torch import nn


def tensors_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's state as CPU tensors (what ``ctx.state`` may hold)."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def seeded(factory, generator: torch.Generator):
    """Build a module with its initial weights drawn from ``generator`` (resumable, process-independent)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()
