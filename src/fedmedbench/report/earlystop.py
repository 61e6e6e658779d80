"""Tables and figures of the early-stopping study (Beyond Fixed Rounds, seed 001).

Everything is computed from the runs' per-round logs (``metrics.csv``): the task-
vector growth rate is logged every round, so the data-free stopping point for any
tau, and the validation-based ones, are evaluated after the fact from one
fixed-budget run (``early_stopping.mode: none``).

* ``stopping_points``: one row per run x tau: stopping round and test metric of the
  data-free rule, of the validation-loss and validation-accuracy rules, the better of
  the two validation rules ("best validation-based stopping point", as the paper
  compares), and the rounds saved (R - r*).
* Table 1: mean (over seeds) test-metric difference data-free minus best validation
  rule, per dataset x method x setting, at the study's tau and patience.
* Table 2: the deliberately bad configuration at tau = 0.1: metric at r*, r*, and
  the differences to the best validation rule (Delta acc, Delta r).
* Figure 3: test metric and growth rate over rounds with both stopping points.
* Figure 4: test metric at the stopping point vs tau, per method, both rules.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.fl.stopping import datafree_stop, growth_rates, validation_stop
from fedmedbench.report import origin as origin_note
from fedmedbench.report.figures import plt

KEYS = ["dataset", "setting", "method"]


def _value_at(series: pd.Series, rnd: int) -> float:
    return float(series.iloc[rnd - 1])


def stopping_points(curves: pd.DataFrame, taus: list[float], patience: int, metric: str,
                    min_delta: str = "relative") -> pd.DataFrame:
    """One row per run x tau (see module docstring)."""
    val_metric = "val_" + metric.removeprefix("global_")
    for col in ("task_norm", metric, "val_loss", val_metric):
        if col not in curves:
            raise KeyError(f"metrics logs lack column '{col}' (needed for early stopping)")
    rows = []
    for (dataset, setting, method, seed), run in curves.groupby(KEYS + ["seed"], sort=False):
        run = run.sort_values("round")
        budget = len(run)
        test = run[metric].reset_index(drop=True)
        for tau in taus:
            r_df = datafree_stop(run["task_norm"].tolist(), tau, patience) or budget
            r_vl = validation_stop(run["val_loss"].tolist(), patience, "min", tau, min_delta) or budget
            r_va = validation_stop(run[val_metric].tolist(), patience, "max", tau, min_delta) or budget
            a_df, a_vl, a_va = (_value_at(test, r) for r in (r_df, r_vl, r_va))
            best_is_loss = a_vl >= a_va
            rows.append({
                "dataset": dataset, "setting": setting, "method": method, "seed": int(seed), "tau": tau,
                "patience": patience, "budget": budget,
                "r_datafree": r_df, "acc_datafree": a_df, "rounds_saved": budget - r_df,
                "r_val_loss": r_vl, "acc_val_loss": a_vl, "r_val_acc": r_va, "acc_val_acc": a_va,
                "best_val_rule": "val_loss" if best_is_loss else "val_acc",
                "r_val_best": r_vl if best_is_loss else r_va, "acc_val_best": max(a_vl, a_va),
            })
    out = pd.DataFrame(rows)
    out["delta_acc"] = out["acc_datafree"] - out["acc_val_best"]
    out["delta_r"] = out["r_datafree"] - out["r_val_best"]
    return out


def table1(points: pd.DataFrame, tau: float, setting_order: list[str], method_order: list[str]) -> pd.DataFrame:
    """Mean (over seeds) delta_acc in percentage points: rows dataset x method, columns settings."""
    sub = points[np.isclose(points["tau"], tau)]
    mean = sub.groupby(["dataset", "method", "setting"])["delta_acc"].mean().mul(100).unstack("setting")
    cols = [s for s in setting_order if s in mean.columns]
    mean = mean[cols].reset_index()
    mean["method"] = pd.Categorical(mean["method"], [m for m in method_order if m in set(mean["method"])], ordered=True)
    return mean.sort_values(["dataset", "method"]).reset_index(drop=True)


def table2(points: pd.DataFrame, setting: str, tau: float, method_order: list[str]) -> pd.DataFrame:
    """Bad configuration at tau: mean over seeds of metric at r*, r*, delta acc, delta r."""
    sub = points[(points["setting"] == setting) & np.isclose(points["tau"], tau)]
    if sub.empty:
        raise ValueError(f"no runs of setting '{setting}' at tau={tau} for Table 2 (early_stopping.bad_setting)")
    agg = sub.groupby(["dataset", "method"]).agg(
        acc=("acc_datafree", "mean"), r_star=("r_datafree", "mean"), delta_acc=("delta_acc", "mean"),
        delta_r=("delta_r", "mean"), rounds_saved=("rounds_saved", "mean"), n_seeds=("seed", "nunique"))
    agg[["acc", "delta_acc"]] *= 100
    agg = agg.reset_index()
    agg["method"] = pd.Categorical(agg["method"], [m for m in method_order if m in set(agg["method"])], ordered=True)
    return agg.sort_values(["dataset", "method"]).reset_index(drop=True)


def caption(what: str, origin: str, seeds: list[int], tau: float, patience: int, metric: str) -> str:
    source = origin_note.source_note(origin, "SYNTHETIC data (demo stand-in; NOT a reproduction of the paper's numbers)")
    return f"{what} Metric: {metric} (%), tau={tau}, patience={patience}, mean over seeds {seeds}. Source: {source}."


_UNSIGNED = {"acc", "r_star", "rounds_saved"}


def _fmt(v: float, signed: bool) -> str:
    if not np.isfinite(v):
        return "n/a"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def write_markdown_latex(frame: pd.DataFrame, cap: str, md_path, tex_path, label: str) -> None:
    from fedmedbench import io

    shown = frame.copy()
    for col in shown.columns:
        if shown[col].dtype.kind == "f":
            signed = col not in _UNSIGNED
            shown[col] = [_fmt(v, signed) for v in shown[col]]
    io.write_text(md_path, f"{cap}\n\n{shown.to_markdown(index=False, disable_numparse=True)}\n")
    io.write_text(tex_path, shown.to_latex(index=False, caption=cap.replace("%", r"\%"), label=label, escape=True))


def figure3(curves: pd.DataFrame, points: pd.DataFrame, method: str, setting: str, tau: float, metric: str, origin: str):
    runs = curves[(curves["method"] == method) & (curves["setting"] == setting)]
    if runs.empty:
        raise ValueError(f"Figure 3: no runs of method '{method}' in setting '{setting}'")
    datasets = list(dict.fromkeys(runs["dataset"]))
    fig, axes = plt.subplots(2, len(datasets), figsize=(4.5 * len(datasets), 5.5), squeeze=False, sharex="col")
    for j, ds in enumerate(datasets):
        sub = runs[runs["dataset"] == ds]
        mean = sub.groupby("round")[metric].mean() * 100
        growth = sub.groupby("seed")["task_norm"].apply(lambda s: pd.Series(growth_rates(s.tolist())))
        g_mean = growth.groupby(level=1).mean()
        ax, axg = axes[0, j], axes[1, j]
        ax.plot(mean.index, mean.values, color="C0", label=f"test {metric}")
        pts = points[(points["method"] == method) & (points["setting"] == setting) & (points["dataset"] == ds)
                     & np.isclose(points["tau"], tau)]
        r_df, r_val = pts["r_datafree"].mean(), pts["r_val_best"].mean()
        ax.axvline(r_df, color="C3", ls="--", label=f"data-free stop (mean r*={r_df:.1f})")
        ax.axvline(r_val, color="C2", ls=":", label=f"validation stop (mean r={r_val:.1f})")
        ax.set_title(f"{ds} / {setting} / {method}", fontsize=9)
        ax.set_ylabel(f"{metric} (%)")
        ax.legend(fontsize=7)
        axg.plot(np.arange(1, len(g_mean) + 1), g_mean.values, color="C1")
        axg.axhline(tau, color="k", lw=0.8, ls="--", label=f"tau={tau}")
        axg.axvline(r_df, color="C3", ls="--")
        axg.set_yscale("log")
        axg.set_xlabel("round")
        axg.set_ylabel("growth rate g_r")
        axg.legend(fontsize=7)
    _suptitle(fig, "Test metric and growth rate over rounds (Fig. 3)", origin)
    return fig


def figure4(points: pd.DataFrame, setting: str, method_order: list[str], metric: str, origin: str):
    sub = points[points["setting"] == setting]
    if sub.empty:
        raise ValueError(f"Figure 4: no runs in setting '{setting}'")
    datasets = list(dict.fromkeys(sub["dataset"]))
    methods = [m for m in method_order if m in set(sub["method"])]
    fig, axes = plt.subplots(len(datasets), len(methods), figsize=(2.6 * len(methods), 2.6 * len(datasets)),
                             squeeze=False, sharey="row")
    for i, ds in enumerate(datasets):
        for j, m in enumerate(methods):
            ax = axes[i, j]
            run = sub[(sub["dataset"] == ds) & (sub["method"] == m)]
            for col, label, color in (("acc_datafree", "data-free", "C3"), ("acc_val_best", "validation", "C2")):
                stats = run.groupby("tau")[col].agg(["mean", "std"]).mul(100)
                ax.plot(stats.index, stats["mean"], marker="o", ms=3, color=color, label=label)
                ax.fill_between(stats.index, stats["mean"] - stats["std"].fillna(0), stats["mean"] + stats["std"].fillna(0),
                                color=color, alpha=0.2)
            ax.set_xscale("log")
            ax.set_title(f"{ds}: {m}", fontsize=8)
            ax.set_xlabel("tau")
            if j == 0:
                ax.set_ylabel(f"{metric} (%)")
            ax.legend(fontsize=6)
    _suptitle(fig, f"Test metric at the stopping point vs tau ({setting}; Fig. 4)", origin)
    return fig


def _suptitle(fig, text: str, origin: str) -> None:
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    fig.suptitle(text + tag, fontsize=10)
    fig.tight_layout()


def load_points(path: str | Path) -> pd.DataFrame:
    return pd.read_csv(path)

