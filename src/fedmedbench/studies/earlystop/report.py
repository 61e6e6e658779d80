"""Tables and figures of the early-stopping study (Beyond Fixed Rounds, seed 001).

Everything is computed from the runs' per-round logs (``metrics.csv``): the task-
vector growth rate is logged every round, so the data-free stopping point for any
tau, and the validation-based ones, are evaluated after the fact from one
fixed-budget run (``early_stopping.mode: none``). The comparisons follow the authors'
result scripts (``result1.py`` Fig. 3, ``result2.py`` Table 1, ``result3.py`` Fig. 4,
``ablation.py`` Table 2):

* ``stopping_points``: one row per run x tau: the 1-based round (``r_*``) and test
  metric (``acc_*``) at the stop of the data-free rule and of the validation-loss and
  validation-accuracy rules (nan when a rule never fires: the authors drop such a
  seed; ``never_fired: budget`` takes the last round instead), and the differences
  delta_acc = acc_datafree - max(acc_val_loss, acc_val_acc) and
  delta_r = r_datafree - min(r_val_loss, r_val_acc), over the rules that fired.
* Table 1: mean over seeds of delta_acc (percentage points), dataset x method rows,
  one column per setting, at the study's tau.
* Table 2: the deliberately bad configuration at tau = 0.1: mean test metric at r*,
  r* as the paper prints it (the reference's 0-based round index), delta_acc, delta_r.
* Figure 3: test metric and growth rate over rounds (mean +/- std over seeds) with the
  loss-based, accuracy-based and data-free stopping points (each the mean over the
  seeds where it fired).
* Figure 4: test metric at the stopping point vs tau, per method, data-free vs the
  better validation rule (mean +/- std over seeds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.fl.stopping import datafree_stop, growth_rates, reported_round, validation_stop
from fedmedbench.report import origin as origin_note
from fedmedbench.report import paper_values
from fedmedbench.report.figures import plt

KEYS = ["dataset", "setting", "method"]
RULES = ("datafree", "val_loss", "val_acc")


def _value_at(series: pd.Series, rnd: float) -> float:
    return float(series.iloc[int(rnd) - 1]) if np.isfinite(rnd) else np.nan


def stopping_points(curves: pd.DataFrame, taus: list[float], patience: int, metric: str,
                    min_delta: str = "absolute", counting: str = "reference", never_fired: str = "drop") -> pd.DataFrame:
    """One row per run x tau (see module docstring)."""
    if never_fired not in ("drop", "budget"):
        raise ValueError(f"early_stopping.never_fired = {never_fired!r}: choose drop or budget")
    val_metric = "val_" + metric.removeprefix("global_")
    for col in ("task_norm", metric, "val_loss", val_metric):
        if col not in curves:
            raise KeyError(f"metrics logs lack column '{col}' (needed for early stopping)")
    acc_scale = 100.0 if min_delta == "absolute" else 1.0  # absolute tau on accuracy is in percentage points
    rows = []
    for (dataset, setting, method, seed), run in curves.groupby(KEYS + ["seed"], sort=False):
        run = run.sort_values("round")
        budget = len(run)
        test = run[metric].reset_index(drop=True)
        for tau in taus:
            found = {
                "datafree": datafree_stop(run["task_norm"].tolist(), tau, patience, counting),
                "val_loss": validation_stop(run["val_loss"].tolist(), patience, "min", tau, min_delta),
                "val_acc": validation_stop(run[val_metric].tolist(), patience, "max", tau, min_delta, acc_scale),
            }
            row = {"dataset": dataset, "setting": setting, "method": method, "seed": int(seed), "tau": tau,
                   "patience": patience, "budget": budget}
            for rule, r in found.items():
                rnd = float(r) if r is not None else (float(budget) if never_fired == "budget" else np.nan)
                row[f"fired_{rule}"] = r is not None
                row[f"r_{rule}"] = rnd
                row[f"acc_{rule}"] = _value_at(test, rnd)
            rows.append(row)
    out = pd.DataFrame(rows)
    val_acc = out[["acc_val_loss", "acc_val_acc"]]
    out["acc_val_best"] = val_acc.max(axis=1, skipna=True)
    out["r_val_first"] = out[["r_val_loss", "r_val_acc"]].min(axis=1, skipna=True)
    out["delta_acc"] = out["acc_datafree"] - out["acc_val_best"]
    out["delta_r"] = out["r_datafree"] - out["r_val_first"]
    out["rounds_saved"] = out["budget"] - out["r_datafree"]
    return out


def table1(points: pd.DataFrame, tau: float, setting_order: list[str], method_order: list[str]) -> pd.DataFrame:
    """Mean (over the seeds where it is defined) delta_acc in points: rows dataset x method, columns settings."""
    sub = points[np.isclose(points["tau"], tau) & points["setting"].isin(setting_order)]
    mean = sub.groupby(["dataset", "method", "setting"])["delta_acc"].mean().mul(100).unstack("setting")
    cols = [s for s in setting_order if s in mean.columns]
    mean = mean[cols].reset_index()
    mean.columns.name = None
    return _ordered(mean, method_order)


def table2(points: pd.DataFrame, setting: str, tau: float, method_order: list[str],
           numbering: str = "zero_based") -> pd.DataFrame:
    """Bad configuration at tau: means over seeds (rules that never fired left out) as ``ablation.py``."""
    sub = points[(points["setting"] == setting) & np.isclose(points["tau"], tau)].copy()
    if sub.empty:
        raise ValueError(f"no runs of setting '{setting}' at tau={tau} for Table 2 (early_stopping.bad_setting)")
    sub["r_star"] = [reported_round(r, numbering) for r in sub["r_datafree"]]
    agg = sub.groupby(["dataset", "method"]).agg(
        acc=("acc_datafree", "mean"), r_star=("r_star", "mean"), delta_acc=("delta_acc", "mean"),
        delta_r=("delta_r", "mean"), n_fired=("fired_datafree", "sum"), n_seeds=("seed", "nunique"))
    agg[["acc", "delta_acc"]] *= 100
    agg["n_fired"] = agg["n_fired"].astype(int)
    return _ordered(agg.reset_index(), method_order)


def _ordered(frame: pd.DataFrame, method_order: list[str]) -> pd.DataFrame:
    present = set(frame["method"])
    order = [m for m in method_order if m in present] + sorted(present - set(method_order))
    frame["method"] = pd.Categorical(frame["method"], order, ordered=True)
    out = frame.sort_values(["dataset", "method"]).reset_index(drop=True)
    out["method"] = out["method"].astype(str)
    return out


def with_paper(table: pd.DataFrame, study: str, name: str, metrics: dict[str, str], synthetic: bool,
               root: str | Path = paper_values.DEFAULT_ROOT) -> tuple[pd.DataFrame, str]:
    """The table with the paper's values and the difference beside ``metrics``; plus the caption note."""
    paper = paper_values.load(study, name, root)
    shown = {c: m for c, m in metrics.items() if c in table.columns}
    return paper_values.beside(table, paper, shown, synthetic), paper_values.note(paper, synthetic)


def dropped_note(points: pd.DataFrame, tau: float, settings: list[str] | None = None) -> str:
    """How many runs each rule never fired in (left out of the means, as the authors' scripts do)."""
    sub = points[np.isclose(points["tau"], tau)]
    if settings is not None:
        sub = sub[sub["setting"].isin(settings)]
    n = len(sub)
    no_df = int((~sub["fired_datafree"].astype(bool)).sum())
    no_val = int((~(sub["fired_val_loss"].astype(bool) | sub["fired_val_acc"].astype(bool))).sum())
    return (f"Runs left out where a rule never fired: data-free {no_df} of {n}; "
            f"both validation rules {no_val} of {n}.")


def caption(what: str, origin: str, seeds: list[int], tau: float, patience: int, metric: str) -> str:
    source = origin_note.source_note(origin, "SYNTHETIC data (demo stand-in; NOT a reproduction of the paper's numbers)")
    return f"{what} Metric: {metric} (%), tau={tau}, patience={patience}, mean over seeds {seeds}. Source: {source}."


_UNSIGNED = {"acc", "r_star", "rounds_saved"}


def _fmt(v: float, signed: bool, col: str) -> str:
    if not np.isfinite(v):
        return "n/a"
    if signed and abs(v) < 0.005:
        return "-"  # the paper's mark for "no difference"
    digits = 1 if col.split(" ")[0] in ("r_star", "delta_r") else 2
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def write_markdown_latex(frame: pd.DataFrame, cap: str, md_path, tex_path, label: str) -> None:
    from fedmedbench.workflow import io

    shown = frame.copy()
    for col in shown.columns:
        if shown[col].dtype.kind == "f":
            signed = col.split(" ")[0] not in _UNSIGNED or col.endswith("Δ")
            shown[col] = [_fmt(v, signed, col) for v in shown[col]]
    io.write_text(md_path, f"{cap}\n\n{shown.to_markdown(index=False, disable_numparse=True)}\n")
    io.write_text(tex_path, shown.to_latex(index=False, caption=cap.replace("%", r"\%"), label=label, escape=True))


# ----------------------------------------------------------------------------- Figure 3


def growth_curves(curves: pd.DataFrame, counting: str = "reference") -> pd.DataFrame:
    """Per seed and round the growth rate as drawn in Fig. 3 (rounds 1-2 left blank, as ``result1.py``)."""
    out = []
    for seed, run in curves.groupby("seed", sort=True):
        run = run.sort_values("round")
        g = np.asarray(growth_rates(run["task_norm"].tolist(), counting), dtype=float)
        g[:2] = np.nan
        out.append(pd.DataFrame({"seed": seed, "round": run["round"].to_numpy(), "growth": g}))
    return pd.concat(out, ignore_index=True)


def mean_std(frame: pd.DataFrame, value: str, ddof: int = 0) -> pd.DataFrame:
    """Mean and std over seeds per round (nan-aware; population std as ``result1.py``)."""
    g = frame.groupby("round")[value]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=ddof).fillna(0.0)})


def first_window(values: np.ndarray, tau: float, patience: int) -> int | None:
    """First index i with ``patience`` consecutive values below tau (``result1.py``: where the mean curve ends)."""
    below = np.array([np.isfinite(v) and v < tau for v in values])
    for i in range(len(below) - patience + 1):
        if below[i:i + patience].all():
            return i
    return None


def figure3_data(curves: pd.DataFrame, points: pd.DataFrame, method: str, setting: str, tau: float,
                 patience: int, metric: str, counting: str = "reference") -> dict[str, dict]:
    """Per dataset: accuracy and growth mean/std by round and the three mean stopping rounds (1-based)."""
    runs = curves[(curves["method"] == method) & (curves["setting"] == setting)]
    if runs.empty:
        raise ValueError(f"Figure 3: no runs of method '{method}' in setting '{setting}'")
    out = {}
    for ds in dict.fromkeys(runs["dataset"]):
        sub = runs[runs["dataset"] == ds]
        acc = mean_std(sub.assign(v=sub[metric] * 100), "v")
        growth = mean_std(growth_curves(sub, counting), "growth")
        end = first_window(growth["mean"].to_numpy(), tau, patience)
        if end is not None:  # the mean growth curve is drawn up to its own stop (result1.py)
            growth.iloc[end + patience + 1:] = np.nan
        pts = points[(points["method"] == method) & (points["setting"] == setting) & (points["dataset"] == ds)
                     & np.isclose(points["tau"], tau)]
        stops = {rule: float(pts[f"r_{rule}"].mean()) if pts[f"fired_{rule}"].any() else None for rule in RULES}
        fired = {rule: (int(pts[f"fired_{rule}"].sum()), len(pts)) for rule in RULES}
        out[ds] = {"acc": acc, "growth": growth, "stops": stops, "fired": fired}
    return out


_STOP_STYLE = {"val_loss": ("C2", ":", "validation loss"), "val_acc": ("C4", "-.", "validation accuracy"),
               "datafree": ("C3", "--", "data-free")}


def figure3(curves: pd.DataFrame, points: pd.DataFrame, method: str, setting: str, tau: float, patience: int,
            metric: str, origin: str, counting: str = "reference"):
    data = figure3_data(curves, points, method, setting, tau, patience, metric, counting)
    fig, axes = plt.subplots(2, len(data), figsize=(4.5 * len(data), 5.5), squeeze=False, sharex="col")
    for j, (ds, d) in enumerate(data.items()):
        ax, axg = axes[0, j], axes[1, j]
        _band(ax, d["acc"], "k", f"test {metric}")
        _band(axg, d["growth"], "C1", "growth rate g_r")
        for rule, r in d["stops"].items():
            color, ls, label = _STOP_STYLE[rule]
            k, n = d["fired"][rule]
            if r is not None:
                ax.axvline(r, color=color, ls=ls, label=f"{label} stop (mean r={r:.1f}, fired in {k}/{n} seeds)")
                if rule == "datafree":
                    axg.axvline(r, color=color, ls=ls)
            else:
                ax.plot([], [], color=color, ls=ls, label=f"{label}: never fired (0/{n} seeds)")
        ax.set_title(f"{ds} / {setting} / {method}", fontsize=9)
        ax.set_ylabel(f"{metric} (%)")
        ax.legend(fontsize=7)
        axg.axhline(tau, color="k", lw=0.8, ls="--", label=f"tau={tau}")
        lo, hi = _finite_range(d["growth"], tau)
        axg.set_ylim(lo, hi)
        axg.set_xlabel("round")
        axg.set_ylabel("growth rate g_r")
        axg.legend(fontsize=7)
    _suptitle(fig, "Test metric and growth rate over rounds, mean ± std over seeds (Fig. 3)", origin)
    return fig


def _band(ax, stats: pd.DataFrame, color: str, label: str) -> None:
    x = stats.index.to_numpy()
    ax.plot(x, stats["mean"].to_numpy(), color=color, lw=1.0, label=label)
    ax.fill_between(x, (stats["mean"] - stats["std"]).to_numpy(), (stats["mean"] + stats["std"]).to_numpy(),
                    color=color, alpha=0.15)


def _finite_range(stats: pd.DataFrame, tau: float) -> tuple[float, float]:
    """y limits holding the whole band and tau (a linear axis: growth rates can be negative)."""
    vals = np.concatenate([(stats["mean"] - stats["std"]).to_numpy(), (stats["mean"] + stats["std"]).to_numpy(), [tau]])
    vals = vals[np.isfinite(vals)]
    lo, hi = float(vals.min()), float(vals.max())
    pad = 0.05 * (hi - lo) if hi > lo else 0.01
    return lo - pad, hi + pad


# ----------------------------------------------------------------------------- Figure 4


def figure4_data(points: pd.DataFrame, setting: str, taus: list[float]) -> pd.DataFrame:
    """Mean and sample std (``result3.py``) over seeds of the data-free and best validation metric, per tau."""
    sub = points[(points["setting"] == setting) & points["tau"].apply(lambda t: bool(np.isclose(taus, t).any()))]
    if sub.empty:
        raise ValueError(f"Figure 4: no runs in setting '{setting}' at taus {taus}")
    g = sub.groupby(["dataset", "method", "tau"])[["acc_datafree", "acc_val_best"]].agg(["mean", "std"]) * 100
    g.columns = [f"{a}_{b}" for a, b in g.columns]
    return g.reset_index()


def figure4(points: pd.DataFrame, setting: str, taus: list[float], method_order: list[str], metric: str, origin: str):
    data = figure4_data(points, setting, taus)
    datasets = list(dict.fromkeys(data["dataset"]))
    methods = [m for m in method_order if m in set(data["method"])]
    fig, axes = plt.subplots(len(datasets), len(methods), figsize=(2.6 * len(methods), 2.6 * len(datasets)),
                             squeeze=False, sharey="row")
    x = np.arange(len(taus))
    for i, ds in enumerate(datasets):
        for j, m in enumerate(methods):
            ax = axes[i, j]
            run = data[(data["dataset"] == ds) & (data["method"] == m)].set_index("tau")
            for col, label, color in (("acc_datafree", "data-free", "C3"), ("acc_val_best", "validation", "C2")):
                mean = np.array([_at(run, t, f"{col}_mean") for t in taus])
                std = np.nan_to_num(np.array([_at(run, t, f"{col}_std") for t in taus]))
                ax.plot(x, mean, marker="o", ms=3, color=color, label=label)
                ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
            ax.set_xticks(x, [str(t) for t in taus])
            ax.set_title(f"{ds}: {m}", fontsize=8)
            ax.set_xlabel("tau")
            if j == 0:
                ax.set_ylabel(f"{metric} (%)")
            ax.legend(fontsize=6)
    sub = points[points["setting"] == setting]
    left_out = int((~sub["fired_datafree"].astype(bool)).sum())
    _suptitle(fig, f"Test metric at the stopping point vs tau ({setting}; Fig. 4); runs x tau where the data-free "
                   f"rule never fired, left out: {left_out} of {len(sub)}", origin)
    return fig


def _at(frame: pd.DataFrame, tau: float, col: str) -> float:
    hit = [t for t in frame.index if np.isclose(t, tau)]
    return float(frame.loc[hit[0], col]) if hit else np.nan


def _suptitle(fig, text: str, origin: str) -> None:
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    fig.suptitle(text + tag, fontsize=10)
    fig.tight_layout()


def load_points(path: str | Path) -> pd.DataFrame:
    return pd.read_csv(path)
