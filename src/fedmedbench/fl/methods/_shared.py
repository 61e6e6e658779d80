"""Small helpers shared by the GPAF-study methods (gpaf, moon, feddg)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def check_params(name: str, defaults: dict[str, Any], choices: dict[str, tuple], params: dict[str, Any]) -> dict[str, Any]:
    """Defaults + given values; unknown keys and invalid choices fail naming the config key."""
    unknown = set(params) - set(defaults)
    if unknown:
        raise TypeError(f"method '{name}' has no parameter(s) {sorted(unknown)} (method_params.{name}); "
                        f"known: {sorted(defaults)}")
    out = {**defaults, **params}
    for key, allowed in choices.items():
        if out[key] not in allowed:
            raise ValueError(f"method_params.{name}.{key} = {out[key]!r}: choose one of {list(allowed)}")
    return out


def tensors_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's state as CPU tensors (what ``ctx.state`` may hold)."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def seeded(factory, generator: torch.Generator):
    """Build a module with its initial weights drawn from ``generator`` (resumable, process-independent)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()
