"""Mean ± std over seeds of final-round metrics, as CSV, Markdown and LaTeX.

Every table states where its numbers come from: data origin (a synthetic table says
so in its caption and file name), number of seeds and rounds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.report import origin as origin_note
from fedmedbench.workflow import io

KEYS = ["dataset", "setting", "method"]


def load_summaries(paths) -> pd.DataFrame:
    rows = []
    for p in paths:
        s = json.loads(Path(p).read_text())
        rows.append({**{k: s[k] for k in ("study", "dataset", "setting", "method", "seed", "data_origin", "rounds", "rounds_run")},
                     "init": s.get("init", "random init"), "trained_in": s.get("trained_in", s["setting"]),
                     **s.get("final", {})})
    if not rows:
        raise ValueError("no run summaries to aggregate")
    return pd.DataFrame(rows)


def aggregate(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    missing = [m for m in metrics if m not in runs]
    if missing:
        raise KeyError(f"report.metrics names unknown metric(s) {missing}; available: {sorted(c for c in runs if '_' in c)}")
    grouped = runs.groupby(KEYS, sort=False)
    out = grouped.size().rename("n_seeds").to_frame()
    for m in metrics:
        out[f"{m}_mean"] = grouped[m].mean()
        out[f"{m}_std"] = grouped[m].std(ddof=1)
    return out.reset_index()


def _fmt(mean: float, std: float) -> str:
    if not np.isfinite(mean):
        return "n/a"
    if not np.isfinite(std):
        return f"{100 * mean:.2f}"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def display_frame(table: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    shown = table[KEYS + ["n_seeds"]].copy()
    for m in metrics:
        shown[m] = [_fmt(a, b) for a, b in zip(table[f"{m}_mean"], table[f"{m}_std"], strict=True)]
    return shown


def caption(study: str, runs: pd.DataFrame, origin: str) -> str:
    seeds = sorted(runs["seed"].unique().tolist())
    rounds = sorted(runs["rounds"].unique().tolist())
    source = origin_note.source_note(origin)
    init = ", ".join(sorted(set(runs["init"]))) if "init" in runs else "random init"
    return (f"Study '{study}': final-round metrics in %, mean ± std over seeds {seeds}; rounds {rounds}. "
            f"Source: {source}; models: {init}.{shown_note(runs)}")


def shown_note(runs: pd.DataFrame) -> str:
    """Which rows repeat a run trained once in another setting with the same pooled inputs (studies/grid.py)."""
    if "trained_in" not in runs:
        return ""
    shown = runs[runs["trained_in"] != runs["setting"]][["method", "setting", "trained_in"]].drop_duplicates()
    parts = [f"{m} in {s} is the run trained in {t}" for m, s, t in shown.itertuples(index=False)]
    return f" Same pooled data, trained once: {'; '.join(parts)}." if parts else ""


def write_tables(table: pd.DataFrame, runs: pd.DataFrame, outputs, study: str, origin: str) -> None:
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    cap = caption(study, runs, origin)
    io.write_csv(outputs.csv, table)
    shown = display_frame(table, metrics)
    io.write_text(outputs.md, f"{cap}\n\n{shown.to_markdown(index=False)}\n")
    latex = shown.to_latex(index=False, caption=cap.replace("%", r"\%"), label=f"tab:{study}", escape=True)
    io.write_text(outputs.tex, latex)
