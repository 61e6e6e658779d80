"""Early-stopping rules, as pure functions of a run's per-round log.

Data-free rule (Beyond Fixed Rounds, Eq. 1-5), computed from global parameters only:
    v_r = theta_r - theta_0 (model parameters, not buffers),  delta_r = ||v_r||_2,
    g_r = (delta_r - delta_{r-1}) / delta_{r-1}  (r >= 2),
    kappa_r = 1[g_r < tau] * (kappa_{r-1} + 1),  kappa_1 = 0,
    r* = min{r >= 2 : kappa_r >= rho}.
The server logs delta_r and g_r every round; because g_r does not depend on tau,
the stopping point for any tau can be recomputed from one fixed-budget run.

Validation rules: validation loss (lower is better) or accuracy (higher is better)
with the same patience rho; a round improves on the best so far by more than tau
(relative to the best, or absolute: ``min_delta``). The rule stops at the first
round with ``patience`` rounds without improvement. Runs that never trigger a rule
stop at the budget R. The metric reported for a rule is the test metric of the
model at its stopping round (theta_{r*} is what the data-free rule returns).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def growth_rates(task_norms: Sequence[float]) -> list[float]:
    """g_r for r = 1..R (g_1 = nan: undefined)."""
    g = [math.nan]
    for prev, cur in zip(task_norms[:-1], task_norms[1:], strict=True):
        g.append((cur - prev) / prev if prev > 0 else math.inf)
    return g


def saturation(growth: Sequence[float], tau: float) -> list[int]:
    """kappa_r for r = 1..R."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    kappa = [0]
    for g in growth[1:]:
        kappa.append(kappa[-1] + 1 if g < tau else 0)
    return kappa


def datafree_stop(task_norms: Sequence[float], tau: float, patience: int) -> int | None:
    """r* (1-based round), or None when the rule never fires within the log."""
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    for r, k in enumerate(saturation(growth_rates(task_norms), tau), start=1):
        if r >= 2 and k >= patience:
            return r
    return None


def validation_stop(values: Sequence[float], patience: int, mode: str, tau: float = 0.0,
                    min_delta: str = "relative") -> int | None:
    """First round with ``patience`` rounds without improvement (1-based), or None."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode}")
    best, since = None, 0
    for r, v in enumerate(values, start=1):
        if v is None or not np.isfinite(v):
            since += 1
        elif best is None:
            best, since = v, 0
        else:
            margin = tau * abs(best) if min_delta == "relative" else tau
            better = v < best - margin if mode == "min" else v > best + margin
            if better:
                best, since = v, 0
            else:
                since += 1
        if since >= patience:
            return r
    return None


class DataFreeMonitor:
    """Per-round task-vector statistics on the server (resumable from the logged rows)."""

    def __init__(self, tau: float, patience: int) -> None:
        self.tau, self.patience = tau, patience

    @staticmethod
    def task_norm(params: dict[str, np.ndarray], theta0: dict[str, np.ndarray]) -> float:
        return float(math.sqrt(sum(float(((params[k].astype(np.float64) - theta0[k].astype(np.float64)) ** 2).sum())
                                   for k in theta0)))

    def update(self, rows: list[dict], norm: float) -> dict[str, float]:
        """Fields for this round's row given the previous rows."""
        prev = rows[-1] if rows else None
        if prev is None:
            return {"task_norm": norm, "growth_rate": math.nan, "saturation": 0, "datafree_stop": 0}
        g = (norm - prev["task_norm"]) / prev["task_norm"] if prev["task_norm"] > 0 else math.inf
        kappa = int(prev["saturation"]) + 1 if g < self.tau else 0
        return {"task_norm": norm, "growth_rate": g, "saturation": kappa,
                "datafree_stop": int(len(rows) + 1 >= 2 and kappa >= self.patience)}
