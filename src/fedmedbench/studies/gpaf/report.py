"""GPAF-paper outputs: Table 1, rounds to a target accuracy (the "25% faster convergence"), t-SNE.

* :func:`table1` — methods x (metric, setting), mean ± std over seeds, in the layout of the
  paper's Table 1 (accuracy, F1, recall, precision per alpha), each cell followed by the paper's
  value and the difference (:mod:`fedmedbench.report.paper_values`). Which evaluation a run
  contributes is ``report.gpaf.table_eval`` (:func:`table_runs`): ``best_validation`` (default)
  is the authors' logging, the global model on the clients' validation shares in the round with
  the best validation accuracy so far; ``final_test`` the final round on the global test set.
  F1, recall and precision are support-weighted averages over the classes by default (``*_weighted``:
  the authors' GPAFflower ``test_gpaf``, scikit-learn ``average='weighted'``); macro averages
  (``*_macro``, update-gpaf's torchmetrics) and 2PR/(P+R) of the macro P and R (``f1_pr_macro``, what
  the printed F1 column is of the printed P and R) are options; the caption says which
  (:func:`metric_definition`).
* :func:`rounds_to_target` — per run the first round whose metric reaches the target; the
  target is given, or ``target_fraction`` x the lowest best accuracy among the federated
  methods (so every method can reach it); speed-up = 1 - rounds / rounds of the reference.
* :func:`tsne_panels` — latent features (posterior mean) of a fixed held-out sample (each
  client's local test data, the same indices for every method): each client's last-round
  model on its own data, the global model on all of it and, for GPAF, generator samples
  z* ~ G(z|y) for the same labels; one t-SNE per method.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedmedbench.report import origin as origin_note  # noqa: E402
from fedmedbench.report import paper_values  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402

LABELS = {"fedavg": "FedAvg", "moon": "MOON", "feddg": "FedDG", "gpaf": "GPAF", "centralized": "Centralized",
          "local": "Local"}
METRIC_LABELS = {"accuracy": "Accuracy", "f1": "F1-Score", "recall": "Recall", "precision": "Precision",
                 "f1_macro": "Macro F1", "recall_macro": "Macro recall", "precision_macro": "Macro precision",
                 "f1_pr_macro": "F1-Score", "f1_pr": "F1-Score (binary P, R)",
                 "f1_weighted": "F1-Score", "recall_weighted": "Recall", "precision_weighted": "Precision",
                 "balanced_accuracy": "Balanced acc.", "auc": "AUC", "loss": "Loss"}
SYNTHETIC_NOTE = "SYNTHETIC data (deterministic stand-in for the demo; NOT a reproduction of the paper's numbers)"


def source_note(origin: str) -> str:
    return origin_note.source_note(origin, SYNTHETIC_NOTE)


def setting_label(name: str, setting: dict[str, Any]) -> str:
    alpha = setting.get("params", {}).get("alpha")
    return f"alpha={alpha:g}" if alpha is not None else name


def ordered(methods, order: list[str]) -> list[str]:
    methods = list(dict.fromkeys(methods))
    return [m for m in order if m in methods] + [m for m in methods if m not in order]


# ----------------------------------------------------------------------------- Table 1


#: which evaluation fills Table 1 (``report.gpaf.table_eval``); the first is the default
TABLE_EVAL = ("best_validation", "final_test")
#: the column prefix of a bare table metric under each evaluation
TABLE_PREFIX = {"best_validation": "val_", "final_test": "global_"}
#: prefixes of the logged metric columns (metrics.csv)
COLUMN_PREFIXES = ("global_", "val_", "local_mean_", "local_std_", "local_")
#: a derived F1: 2PR/(P+R) of the precision and recall with the same prefix and suffix
F1_FROM_PR = "f1_pr"


def table_columns(metrics: list[str], table_eval: str) -> list[str]:
    """``report.gpaf.table_metrics`` as metric columns: a bare name (``accuracy``) takes the evaluation's
    prefix (``val_`` for ``best_validation``, ``global_`` for ``final_test``); a prefixed name is kept."""
    if table_eval not in TABLE_EVAL:
        raise ValueError(f"report.gpaf.table_eval = {table_eval!r}: choose one of {list(TABLE_EVAL)}")
    return [m if m.startswith(COLUMN_PREFIXES) else TABLE_PREFIX[table_eval] + m for m in metrics]


def f1_from_precision_recall(precision, recall):
    """2PR/(P+R), 0 where P + R = 0 (the paper's F1 column equals this of its own P and R in 8 of 9 rows)."""
    p, r = np.asarray(precision, dtype=float), np.asarray(recall, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p + r > 0, 2 * p * r / (p + r), 0.0)


def with_derived_f1(runs: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Add each requested ``<prefix>f1_pr<suffix>`` column from ``<prefix>precision<suffix>`` and ``<prefix>recall<suffix>``."""
    out = runs
    for col in columns:
        if col in runs or F1_FROM_PR not in col:
            continue
        head, _, tail = col.partition(F1_FROM_PR)
        p, r = f"{head}precision{tail}", f"{head}recall{tail}"
        if p in runs and r in runs:
            out = out.assign(**{col: f1_from_precision_recall(runs[p], runs[r])})
    return out


def best_validation_rows(curves: pd.DataFrame, metric: str = "val_accuracy") -> pd.DataFrame:
    """Per run (dataset, setting, method, seed), the metrics row of the first round with the highest ``metric``.

    The authors' client keeps the metrics of the round whose validation accuracy beats its best so far
    (strictly: a later tie does not replace it) and the server the best mean over clients
    (GPAFflower client.py:165-189, server.py:202-206); after the last round that is the round of the
    highest value, the first on ties. ``table_round`` names it.
    """
    if metric not in curves:
        raise KeyError(f"report.gpaf.table_eval best_validation needs '{metric}' in metrics.csv; "
                       f"available: {sorted(curves.columns)}")
    keys = ["dataset", "setting", "method", "seed"]
    rows = []
    for _, g in curves.sort_values("round", kind="stable").groupby(keys, sort=False):
        values = g[metric].to_numpy(dtype=float)
        if not np.isfinite(values).any():
            raise ValueError(f"run {dict(zip(keys, g.iloc[0][keys], strict=True))}: no finite {metric} in any round")
        best = g.iloc[int(np.nanargmax(values))]
        rows.append({**best.to_dict(), "table_round": int(best["round"]), "rounds": int(g["round"].max())})
    return pd.DataFrame(rows)


def table_runs(summaries, metrics_csvs, table_eval: str) -> pd.DataFrame:
    """One row per run with the metrics Table 1 reads: the final round's (``final_test``, from the
    summaries) or the best validation round's (``best_validation``, from the metrics CSVs)."""
    table_columns([], table_eval)  # validates the name
    if table_eval == "final_test":
        return load_runs(summaries)
    from fedmedbench.report.figures import load_curves as generic

    if not metrics_csvs:
        raise ValueError("no run metrics for Table 1")
    return best_validation_rows(generic(metrics_csvs))


def load_runs(paths) -> pd.DataFrame:
    rows = []
    for p in paths:
        s = json.loads(Path(p).read_text())
        rows.append({"dataset": s["dataset"], "setting": s["setting"], "method": s["method"], "seed": s["seed"],
                     "rounds": s["rounds"], **s.get("final", {})})
    if not rows:
        raise ValueError("no run summaries for Table 1")
    return pd.DataFrame(rows)


def metric_name(metric: str) -> str:
    """``global_f1`` -> ``f1``: the metric's name in the paper's table."""
    return metric.removeprefix(column_prefix(metric))


def paper_metric(metric: str) -> str:
    """``global_f1_macro``, ``val_f1_pr_macro``, ``val_f1_weighted`` -> ``f1``: the paper's column a metric of the
    table sits beside."""
    name = metric_name(metric).removesuffix("_macro").removesuffix("_weighted")
    return "f1" if name == F1_FROM_PR else name


def metric_definition(n_classes: int, class_names: tuple[str, ...] = (), metrics: tuple[str, ...] = ()) -> str:
    """Caption sentence: which F1/recall/precision the table shows for a dataset with ``n_classes``."""
    names = {metric_name(m) for m in metrics}
    out = []
    if any(n.endswith("_weighted") for n in names):
        out.append(f"Weighted F1, recall and precision are means over the {n_classes} classes weighted by their true "
                   "counts (scikit-learn's average='weighted', as the authors' evaluation; weighted recall equals "
                   "accuracy).")
    if any(n.endswith("_macro") for n in names):
        out.append(f"Macro recall and precision are unweighted means over the {n_classes} classes, as the "
                   "paper's (its printed accuracy, precision and recall fit macro averages, not binary ones).")
    if any(n.startswith(F1_FROM_PR) for n in names):
        out.append("F1 is 2PR/(P+R) of the shown precision and recall, as the paper's F1 column is of its own.")
    if "f1_macro" in names:
        out.append("Macro F1 is the mean of the per-class F1s.")
    names = {n for n in names if not n.startswith(F1_FROM_PR)}
    if names & {"f1", "recall", "precision"}:
        if n_classes == 2:
            name = f" ('{class_names[1]}')" if len(class_names) > 1 else ""
            out.append(f"F1, recall and precision are binary with class 1{name} as the positive class.")
        else:
            out.append(f"F1, recall and precision are macro averages over the {n_classes} classes.")
    return " ".join(out)


def table1(runs: pd.DataFrame, metrics: list[str], method_order: list[str], settings: dict[str, dict],
           paper: paper_values.PaperTable | None = None, synthetic: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(long table: one row per setting x method with mean/std/n and the paper's value; display table in the paper's layout).

    Each metric x setting column of the display is followed by ``(paper)`` and ``Δ`` (ours minus
    paper, percentage points; empty on synthetic data).
    """
    runs = with_derived_f1(runs, metrics)
    missing = [m for m in metrics if m not in runs]
    if missing:
        raise KeyError(f"report.gpaf.table_metrics names unknown metric(s) {missing}; available: {sorted(runs.columns)}")
    grouped = runs.groupby(["dataset", "setting", "method"], sort=False)
    long = grouped.size().rename("n_seeds").to_frame()
    for m in metrics:
        long[f"{m}_mean"] = grouped[m].mean()
        long[f"{m}_std"] = grouped[m].std(ddof=1)
    long = long.reset_index()
    pct = long[["dataset", "setting", "method"]].copy()
    for m in metrics:
        pct[f"{m}_pct"] = 100 * long[f"{m}_mean"]
    pct = paper_values.beside(pct, paper, {f"{m}_pct": paper_metric(m) for m in metrics}, synthetic)
    for m in metrics:
        long[f"{m}_paper"] = pct[f"{m}_pct (paper)"].to_numpy()
        long[f"{m}_diff"] = pct[f"{m}_pct Δ"].to_numpy()
    set_order = [s for s in settings if s in set(long["setting"])]
    methods = ordered(long["method"], method_order)
    display = pd.DataFrame({"Method": [LABELS.get(m, m) for m in methods]})
    for metric in metrics:
        for s in set_order:
            col = f"{METRIC_LABELS.get(metric_name(metric), metric)} ({setting_label(s, settings[s])})"
            ours, theirs, diff = [], [], []
            for method in methods:
                row = long[(long["setting"] == s) & (long["method"] == method)]
                if not len(row):
                    ours.append("–"), theirs.append("–"), diff.append("–")
                    continue
                r = row.iloc[0]
                ours.append(_fmt(r[f"{metric}_mean"], r[f"{metric}_std"]))
                theirs.append(_number(r[f"{metric}_paper"]))
                diff.append(_number(r[f"{metric}_diff"], signed=True))
            display[col], display[f"{col} paper"], display[f"{col} Δ"] = ours, theirs, diff
    return long, display


def _number(value: float, signed: bool = False) -> str:
    if not np.isfinite(value):
        return ""
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _fmt(mean: float, std: float) -> str:
    if not np.isfinite(mean):
        return "n/a"
    return f"{100 * mean:.2f}" if not np.isfinite(std) else f"{100 * mean:.2f} ± {100 * std:.2f}"


#: which global model a Table 1 row is, by ``table_eval``
TABLE_MODEL_NOTE = {
    "best_validation": "the global model of the round with the best validation accuracy (the authors' best-so-far "
                       "logging)",
    "final_test": "the final-round global model",
}
#: what a metric column is evaluated on, by its prefix (longest prefixes first, as COLUMN_PREFIXES)
COLUMN_DATA_NOTE = {
    "global_": "the global test set",
    "val_": "the clients' validation data (pooled)",
    "local_mean_": "each client's test split (mean over clients)",
    "local_std_": "each client's test split (std over clients)",
    "local_": "each client's test split",
}


def column_prefix(column: str) -> str:
    """The prefix of a metric column (``val_`` of ``val_f1_pr_macro``); '' for a bare name."""
    return next((p for p in COLUMN_PREFIXES if column.startswith(p)), "")


def evaluation_note(table_eval: str, columns: tuple[str, ...]) -> str:
    """Caption clause: which global model each shown column is and what it is evaluated on.

    Under ``best_validation`` every column is read from the round with the best validation accuracy, so a
    ``global_`` column is that round's model on the test split, not the final model; under ``final_test``
    a ``val_`` column is the final model on the validation data, not the best round's."""
    table_columns([], table_eval)  # validates the name
    families: dict[str, list[str]] = {}
    for col in columns:
        prefix = column_prefix(col) or TABLE_PREFIX[table_eval]
        families.setdefault(prefix, []).append(col.removeprefix(prefix))
    model = TABLE_MODEL_NOTE[table_eval]
    if len(families) <= 1:
        prefix = next(iter(families), TABLE_PREFIX[table_eval])
        note = f"{model} on {COLUMN_DATA_NOTE[prefix]}"
    else:
        note = f"{model}: " + "; ".join(f"{', '.join(names)} on {COLUMN_DATA_NOTE[p]}" for p, names in families.items())
    home = TABLE_PREFIX[table_eval]
    others = [p for p in families if p != home]
    if others and table_eval == "best_validation":
        note += (" (every column from that round: the test-split columns are the model of the best validation "
                 "round, not the final model)")
    elif "val_" in others and table_eval == "final_test":
        note += " (every column from the final round: the validation columns are not the best validation round's)"
    return note


def write_table1(long: pd.DataFrame, display: pd.DataFrame, runs: pd.DataFrame, outputs, study: str, dataset: str,
                 origin: str, paper: paper_values.PaperTable | None = None, init: str = "random init",
                 table_eval: str = "final_test") -> None:
    from fedmedbench.data.medmnist import dataset_info

    info = dataset_info(dataset)
    seeds = sorted(runs["seed"].unique().tolist())
    rounds = sorted(runs["rounds"].unique().tolist())
    if "table_round" in runs:
        rounds = f"{rounds}, validation-best rounds {sorted(int(r) for r in runs['table_round'].unique())}"
    shown = tuple(c.removesuffix("_mean") for c in long.columns if c.endswith("_mean"))
    cap = (f"Study '{study}', {dataset}: GPAF paper Table 1 layout; {evaluation_note(table_eval, shown)}, in %, "
           f"mean ± std over seeds {seeds}; rounds {rounds}. {metric_definition(info.n_classes, info.class_names, shown)} "
           f"{paper_values.note(paper, origin == 'synthetic')} Source: {source_note(origin)}. "
           f"Models: {init}.")
    io.write_csv(outputs.csv, long)
    io.write_text(outputs.md, f"{cap}\n\n{display.to_markdown(index=False, disable_numparse=True)}\n")  # keep "+1.38"
    io.write_text(outputs.tex, display.to_latex(index=False, caption=cap.replace("%", r"\%"), label=f"tab:{study}-{dataset}",
                                                escape=True))


# ----------------------------------------------------------------------------- convergence


def load_curves(paths, setting_order: list[str] | None = None) -> pd.DataFrame:
    """Per-round metrics of all runs, rows ordered by setting as in the config, then dataset and round."""
    from fedmedbench.report.figures import load_curves as generic

    curves = generic(paths)
    order = {s: i for i, s in enumerate(setting_order or [])}
    key = curves["setting"].map(lambda s: order.get(s, len(order)))
    return curves.assign(_o=key).sort_values(["_o", "dataset", "setting", "seed", "round"], kind="stable").drop(columns="_o")


def first_round_reaching(curve: pd.DataFrame, metric: str, target: float) -> float:
    hit = curve[curve[metric] >= target - 1e-12]
    return float(hit["round"].min()) if len(hit) else math.nan


def rounds_to_target(curves: pd.DataFrame, metric: str, target: float | None, target_fraction: float,
                     reference: str, method_order: list[str]) -> pd.DataFrame:
    if metric not in curves:
        raise KeyError(f"report.gpaf.convergence_metric '{metric}' is not a logged metric; available: {sorted(curves.columns)}")
    rows = []
    for (dataset, setting), sub in curves.groupby(["dataset", "setting"], sort=False):
        best = sub.groupby(["method", "seed"])[metric].max().groupby("method").mean()
        fl_best = best.drop(labels=["centralized", "local"], errors="ignore")
        tgt = float(target) if target is not None else target_fraction * float((fl_best if len(fl_best) else best).min())
        per_method = {}
        for method in ordered(sub["method"], method_order):
            runs = sub[sub["method"] == method]
            hits = [first_round_reaching(g.sort_values("round"), metric, tgt) for _, g in runs.groupby("seed")]
            reached = [h for h in hits if np.isfinite(h)]
            per_method[method] = {
                "dataset": dataset, "setting": setting, "method": method, "metric": metric, "target": tgt,
                "best_mean": float(best.get(method, math.nan)), "n_seeds": len(hits), "n_reached": len(reached),
                "rounds_mean": float(np.mean(reached)) if reached else math.nan,
                "rounds_std": float(np.std(reached, ddof=1)) if len(reached) > 1 else math.nan,
            }
        ref = per_method.get(reference, {}).get("rounds_mean", math.nan)
        for rec in per_method.values():
            rec[f"speedup_vs_{reference}_pct"] = 100 * (1 - rec["rounds_mean"] / ref) if np.isfinite(ref) and ref > 0 else math.nan
            rows.append(rec)
    return pd.DataFrame(rows)


def write_rounds_table(table: pd.DataFrame, csv: str, md: str, study: str, origin: str, reference: str) -> None:
    shown = table.copy()
    shown["method"] = [LABELS.get(m, m) for m in shown["method"]]
    shown["target"] = [f"{100 * t:.2f}" for t in shown["target"]]
    shown["rounds to target"] = [
        "not reached" if not np.isfinite(m) else (f"{m:.1f}" if not np.isfinite(s) else f"{m:.1f} ± {s:.1f}")
        for m, s in zip(table["rounds_mean"], table["rounds_std"], strict=True)]
    shown["reached"] = [f"{a}/{b}" for a, b in zip(table["n_reached"], table["n_seeds"], strict=True)]
    col = f"speedup_vs_{reference}_pct"
    shown[f"faster than {LABELS.get(reference, reference)}"] = ["n/a" if not np.isfinite(v) else f"{v:.0f}%" for v in table[col]]
    shown = shown[["dataset", "setting", "method", "target", "rounds to target", "reached",
                   f"faster than {LABELS.get(reference, reference)}"]]
    cap = (f"Study '{study}': rounds until {table['metric'].iloc[0]} first reaches the target (in %; mean ± std over the "
           f"seeds that reach it; speed-up = 1 - rounds / rounds of {LABELS.get(reference, reference)}). "
           f"Source: {source_note(origin)}.")
    io.write_csv(csv, table)
    io.write_text(md, f"{cap}\n\n{shown.to_markdown(index=False)}\n")


def best_so_far(curves: pd.DataFrame, metric: str) -> pd.Series:
    """Mean over seeds of the best ``metric`` reached up to each round (Fig. 5a records a value
    "only when it surpassed the previous best"), indexed by round."""
    if metric not in curves:
        raise KeyError(f"report.gpaf.fig5a_metric '{metric}' is not a logged metric; available: {sorted(curves.columns)}"
                       + ("; client_val_* needs the study's client_validation on" if metric.startswith("client_val_") else ""))
    g = curves.sort_values("round").copy()
    g["best"] = g.groupby("seed")[metric].cummax()
    return g.groupby("round")["best"].mean()


def fig5a_frame(curves: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Fig. 5a: per (dataset, setting, method) and round, the best ``metric`` so far (mean over seeds);
    by default (``report.gpaf.fig5a_metric``) ``val_accuracy``, the global model on the clients'
    validation data, as the GPAF authors' server logs it; ``client_val_accuracy`` = the clients' own
    models after local training on their own validation data, averaged over the clients."""
    rows = []
    for (dataset, setting, method), g in curves.groupby(["dataset", "setting", "method"], sort=False):
        best = best_so_far(g, metric)
        rows += [{"dataset": dataset, "setting": setting, "method": method, "round": int(r), "metric": metric,
                  "best_so_far": float(v)} for r, v in best.items()]
    return pd.DataFrame(rows)


def epoch_columns(curves: pd.DataFrame) -> list[str]:
    """The per-local-epoch training-loss columns ``train_loss_e1, train_loss_e2, ...`` in epoch order."""
    cols = [c for c in curves.columns if c.startswith("train_loss_e") and c[len("train_loss_e"):].isdigit()]
    return sorted(cols, key=lambda c: int(c[len("train_loss_e"):]))


def fig5b_frame(curves: pd.DataFrame) -> pd.DataFrame:
    """Fig. 5b: the clients' training loss per local epoch (example-weighted over clients as logged,
    mean over seeds), at the global local-epoch index (round - 1) * E + e, E = the run's epochs per round."""
    cols = epoch_columns(curves)
    if not cols:
        raise KeyError("the runs log no per-epoch training losses (train_loss_e1, ...): rerun them with this version")
    ids = ["dataset", "setting", "method", "seed", "round"]
    long = curves[ids + cols].melt(id_vars=ids, value_vars=cols, var_name="col", value_name="loss").dropna(subset=["loss"])
    long["epoch"] = long["col"].str[len("train_loss_e"):].astype(int)
    per_round = long.groupby(["dataset", "setting", "method", "seed"])["epoch"].transform("max")
    long["local_epoch"] = (long["round"] - 1) * per_round + long["epoch"]
    out = (long.groupby(["dataset", "setting", "method", "local_epoch"], sort=False)
           .agg(round=("round", "first"), epoch=("epoch", "first"), train_loss=("loss", "mean"))
           .reset_index())
    return out.sort_values(["dataset", "setting", "method", "local_epoch"], kind="stable").reset_index(drop=True)


def convergence_figure(curves: pd.DataFrame, targets: pd.DataFrame, metric: str, study: str, origin: str,
                       method_order: list[str], fig5a_metric: str | None = None):
    """Row 1 (Fig. 5a): best-so-far ``fig5a_metric`` per round (:func:`fig5a_frame`) and the
    rounds-to-target line of ``metric`` when it is the same metric; row 2 (Fig. 5b): the clients'
    training loss per local epoch (:func:`fig5b_frame`)."""
    shown = fig5a_metric or metric
    acc, loss = fig5a_frame(curves, shown), fig5b_frame(curves)
    panels = curves[["dataset", "setting"]].drop_duplicates().values.tolist()
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.2), squeeze=False)
    for j, (dataset, setting) in enumerate(panels):
        a = acc[(acc["dataset"] == dataset) & (acc["setting"] == setting)]
        b = loss[(loss["dataset"] == dataset) & (loss["setting"] == setting)]
        for method in ordered(a["method"], method_order):
            g, h = a[a["method"] == method], b[b["method"] == method]
            axes[0, j].plot(g["round"], g["best_so_far"], marker="o", ms=3, label=LABELS.get(method, method))
            axes[1, j].plot(h["local_epoch"], h["train_loss"], marker=".", ms=2, lw=1, label=LABELS.get(method, method))
        tgt = targets[(targets["dataset"] == dataset) & (targets["setting"] == setting)]["target"]
        if len(tgt) and shown == metric:
            axes[0, j].axhline(float(tgt.iloc[0]), color="grey", ls="--", lw=1, label="target")
        axes[0, j].set_title(f"{dataset} / {setting}", fontsize=9)
        axes[0, j].set_ylabel(f"best {shown} so far")
        axes[0, j].set_xlabel("round")
        axes[1, j].set_ylabel("clients' train loss")
        axes[1, j].set_xlabel("local epoch ((round - 1) E + e)")
        for ax in axes[:, j]:
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    fig.suptitle(f"{study}: convergence{tag}", fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- t-SNE


def heldout_indices(n: int, k: int, seed: int, pid: int) -> np.ndarray:
    """The fixed held-out sample of a client: the same indices for every method."""
    return np.sort(np.random.default_rng([seed, pid]).permutation(n)[: min(k, n)])


def latent_features(spec_dict: dict, samples_per_client: int, generator_samples: int, seed: int) -> dict[str, np.ndarray]:
    """features (N, d), labels (N,), groups (N,) of clients, the global model and (GPAF) the generator."""
    import torch

    from fedmedbench.fl.api.arrays import load_arrays
    from fedmedbench.fl.api.registry import get_method
    from fedmedbench.fl.data import FederatedData
    from fedmedbench.fl.engine.federation import resolve_data_shapes
    from fedmedbench.fl.spec import RunSpec
    from fedmedbench.fl.training import to_float

    spec = resolve_data_shapes(RunSpec.from_dict(dict(spec_dict)))
    run_dir = Path(spec.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    if not summary.get("client_models"):
        raise FileNotFoundError(f"{run_dir / 'summary.json'}: the run kept no client models; set the study's "
                                "save_client_models: true (needed by report.gpaf.tsne)")
    clients = torch.load(run_dir / summary["client_models"], map_location="cpu", weights_only=True)
    # the kept round's global model: stored beside the clients for an earlier round, else the final model.pt
    stored_global = clients.pop("global", None)
    if stored_global is None:
        stored_global = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    global_arrays = dict(stored_global)
    method = get_method(spec.method, spec.method_params, spec.method_file)
    data = FederatedData(spec.partition_path, spec.sources)
    cpu = torch.device("cpu")

    def model_with(arrays):
        model = method.build_model(spec)
        load_arrays(model, arrays, method.shared_keys(model))
        if not hasattr(model, "embed"):
            raise TypeError(f"model '{spec.model}' has no embed(); the t-SNE needs latent features (use gpaf_cnn)")
        return model.eval()

    feats, labels, groups, xs = [], [], [], []
    with torch.no_grad():
        for pid in sorted(clients, key=int):
            c = data.client(int(pid))
            idx = torch.as_tensor(heldout_indices(len(c.test_y), samples_per_client, seed, int(pid)))
            x, y = c.test_x[idx], c.test_y[idx]
            local = model_with({**global_arrays, **clients[pid]})
            feats.append(local.embed(to_float(x, cpu)).numpy())
            labels.append(y.numpy())
            groups += [f"client {pid}"] * len(y)
            xs.append((x, y))
        glob = model_with(global_arrays)
        for x, y in xs:
            feats.append(glob.embed(to_float(x, cpu)).numpy())
            labels.append(y.numpy())
            groups += ["global"] * len(y)
        if hasattr(glob, "generator") and generator_samples:
            y = torch.cat([y for _, y in xs])[:generator_samples]
            g = torch.Generator().manual_seed(seed)
            z = glob.generator(torch.nn.functional.one_hot(y, spec.num_classes).float(), g)[0]
            feats.append(z.numpy())
            labels.append(y.numpy())
            groups += ["generator z*"] * len(y)
    return {"features": np.concatenate(feats), "labels": np.concatenate(labels), "groups": np.array(groups)}


def tsne_embedding(features: np.ndarray, perplexity: float, seed: int) -> np.ndarray:
    from sklearn.manifold import TSNE

    perp = float(min(perplexity, max(2.0, (len(features) - 1) / 3)))
    return TSNE(n_components=2, perplexity=perp, init="pca", random_state=seed).fit_transform(features)


MARKERS = {"global": "X", "generator z*": "+"}
CLIENT_MARKERS = ["o", "s", "^", "D", "v", "P", "*", "h"]


def tsne_figure(panels: dict[str, dict[str, np.ndarray]], title: str):
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, (method, p) in zip(axes.flat, panels.items(), strict=True):
        emb, labels, groups = p["embedding"], p["labels"], p["groups"]
        names, markers = list(dict.fromkeys(groups)), _markers(groups)
        for group, marker in zip(names, markers, strict=True):
            sel = groups == group
            ax.scatter(emb[sel, 0], emb[sel, 1], c=[cmap(int(c) % 10) for c in labels[sel]], marker=marker, s=14,
                       alpha=0.75, linewidths=0.8 if marker in ("+", "X") else 0.0)
        ax.set_title(LABELS.get(method, method), fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        handles = [plt.Line2D([], [], color="k", marker=m, ls="", ms=6, label=g) for g, m in zip(names, markers, strict=True)]
        classes = sorted(set(labels.tolist()))
        handles += [plt.Line2D([], [], color=cmap(c % 10), marker="o", ls="", ms=6, label=f"class {c}") for c in classes]
        ax.legend(handles=handles, fontsize=6, loc="best", ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _markers(groups: np.ndarray) -> list[str]:
    return [MARKERS.get(g, CLIENT_MARKERS[i % len(CLIENT_MARKERS)]) for i, g in enumerate(dict.fromkeys(groups))]


def tsne_panels(specs: dict[str, dict], tsne: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    panels = {}
    for method, spec in specs.items():
        f = latent_features(spec, tsne["samples_per_client"], tsne["generator_samples"], tsne["seed"])
        panels[method] = {"embedding": tsne_embedding(f["features"], tsne["perplexity"], tsne["seed"]),
                          "labels": f["labels"], "groups": f["groups"]}
    return panels
