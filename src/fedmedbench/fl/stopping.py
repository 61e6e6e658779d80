"""Early-stopping rules, as pure functions of a run's per-round log.

Rounds are 1-based here (r = 1 is the first aggregation); :func:`reported_round` turns a
1-based round into the number the paper's tables print.

Data-free rule (Beyond Fixed Rounds, Eqs. 1-5), computed from global parameters only:
    v_r = theta_r - theta_0 (model parameters, not buffers),  delta_r = ||v_r||_2,
    g_r = (delta_r - delta_{r-1}) / delta_{r-1}  (r >= 2),
    kappa_r = 1[g_r < tau] * (kappa_{r-1} + 1),  kappa_1 = 0,
    r* = min{r >= 2 : kappa_r >= rho}.
Two readings of the counter (``counting``):
    "reference" (the authors' server/server.py): g_r is taken as 1 when delta_{r-1} <= 1e-6
        (or is not a number), the counter first moves at r = 3 (g_2 is computed but not
        counted), and a round with g_r exactly 0 leaves the counter unchanged;
    "paper" (Eqs. 4-5 as printed): the counter moves from r = 2 on.
Because g_r does not depend on tau, the stopping point for any tau is recomputed from
one fixed-budget run.

Validation rules: validation loss (lower is better) or accuracy (higher is better) with
the same patience rho; a round counts as an improvement when it beats the best so far
by more than tau. ``min_delta``:
    "absolute" (the authors' code): loss must fall below best - tau; accuracy, in
        percent (x 100), must exceed best + tau percentage points; the best starts at
        +inf (loss) and 0 (accuracy), so a non-finite value never improves;
    "relative": by more than tau * |best|, the best starting at the first round.
The rule fires at the first round with ``patience`` rounds without improvement; a rule
that never fires returns None (the reference then drops that seed from its means).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

COUNTINGS = ("reference", "paper")
MIN_DELTAS = ("absolute", "relative")
NUMBERINGS = ("zero_based", "one_based")

#: below this previous distance the reference code sets the growth rate to 1
_TINY = 1e-6


def growth_rates(task_norms: Sequence[float], counting: str = "reference") -> list[float]:
    """g_r for r = 1..R; g_1 is undefined (nan; the reference records 0 and never counts it)."""
    _check(counting, COUNTINGS, "counting")
    g = [math.nan]
    for prev, cur in zip(task_norms[:-1], task_norms[1:], strict=True):
        if counting == "reference":
            g.append((cur - prev) / prev if prev > _TINY else 1.0)  # nan > tiny is False -> 1.0
        else:
            g.append((cur - prev) / prev if prev > 0 else math.inf)
    return g


def saturation(growth: Sequence[float], tau: float, counting: str = "reference") -> list[int]:
    """kappa_r for r = 1..R (see the module docstring for the two countings)."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    _check(counting, COUNTINGS, "counting")
    kappa = [0]
    for r, g in enumerate(growth[1:], start=2):
        kappa.append(_next_kappa(kappa[-1], g, r, tau, counting))
    return kappa


def datafree_stop(task_norms: Sequence[float], tau: float, patience: int, counting: str = "reference") -> int | None:
    """r* (1-based round), or None when the rule never fires within the log."""
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    for r, k in enumerate(saturation(growth_rates(task_norms, counting), tau, counting), start=1):
        if r >= 2 and k >= patience:
            return r
    return None


def validation_stop(values: Sequence[float], patience: int, mode: str, tau: float = 0.0,
                    min_delta: str = "absolute", scale: float = 1.0) -> int | None:
    """First round (1-based) with ``patience`` rounds without improvement, or None.

    ``scale`` multiplies the values before comparing (100: accuracy in percent, so an
    absolute tau is in percentage points, as the reference compares them).
    """
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode}")
    _check(min_delta, MIN_DELTAS, "min_delta")
    if min_delta == "absolute":
        best = math.inf if mode == "min" else 0.0
    else:
        best = None
    since = 0
    for r, raw in enumerate(values, start=1):
        v = math.nan if raw is None else float(raw) * scale
        if best is None:  # relative: the first finite value sets the best
            if np.isfinite(v):
                best, since = v, 0
            else:
                since += 1
        else:
            margin = tau if min_delta == "absolute" else tau * abs(best)
            better = v < best - margin if mode == "min" else v > best + margin  # False for nan
            if better:
                best, since = v, 0
            else:
                since += 1
        if since >= patience:
            return r
    return None


def reported_round(r: int | float | None, numbering: str = "zero_based") -> float:
    """The round number a table prints for 1-based round r (nan when the rule never fired).

    The reference logs its 0-based loop index t (round r = t + 1), so ``zero_based``
    prints r - 1: the paper's r* of Table 2 is that index.
    """
    _check(numbering, NUMBERINGS, "round_numbering")
    if r is None or (isinstance(r, float) and math.isnan(r)):
        return math.nan
    return float(r) - 1.0 if numbering == "zero_based" else float(r)


def _check(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise ValueError(f"early_stopping.{key} = {value!r}: choose one of {list(allowed)}")


class DataFreeMonitor:
    """Per-round task-vector statistics on the server (resumable from the logged rows)."""

    def __init__(self, tau: float, patience: int, counting: str = "reference") -> None:
        _check(counting, COUNTINGS, "counting")
        self.tau, self.patience, self.counting = tau, patience, counting

    @staticmethod
    def task_norm(params: dict[str, torch.Tensor], theta0: dict[str, torch.Tensor]) -> float:
        """||theta_r - theta_0|| over theta_0's keys, in float64, where the first of ``params`` is (the
        arrays are read from their device once): per-tensor sums of squares in torch, added in key order."""
        import torch

        from fedmedbench.fl.api.arrays import snapshot

        if not theta0:
            return 0.0
        keys = list(theta0)
        device = params[keys[0]].device
        with torch.no_grad():
            # theta_r in float64 by one conversion, an exact one; the differences in place in that copy
            d = list(snapshot({k: params[k] for k in keys}, device, torch.float64).values())
            # multi-tensor ops: one launch each on a GPU, not one per tensor; x * x is x ** 2 bit for bit
            torch._foreach_sub_(d, [theta0[k].to(device, torch.float64) for k in keys])
            sq = torch.stack([s.sum() for s in torch._foreach_mul(d, d)])
            return float(math.sqrt(float(sq.sum())))

    def update(self, rows: list[dict], norm: float) -> dict[str, float]:
        """Fields for this round's row given the previous rows."""
        prev = rows[-1] if rows else None
        if prev is None:
            return {"task_norm": norm, "growth_rate": math.nan, "saturation": 0, "datafree_stop": 0}
        r = len(rows) + 1
        g = growth_rates([prev["task_norm"], norm], self.counting)[1]
        kappa = _next_kappa(int(prev["saturation"]), g, r, self.tau, self.counting)
        return {"task_norm": norm, "growth_rate": g, "saturation": kappa,
                "datafree_stop": int(r >= 2 and kappa >= self.patience)}


def _next_kappa(prev: int, g: float, r: int, tau: float, counting: str) -> int:
    """kappa_r from kappa_{r-1} (the step of :func:`saturation`)."""
    first = 3 if counting == "reference" else 2
    if r < first or (counting == "reference" and g == 0.0):
        return prev
    return prev + 1 if g < tau else 0
