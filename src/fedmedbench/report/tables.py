"""Mean ± std over seeds of final-round metrics, as CSV, Markdown and LaTeX.

Every table states where its numbers come from: data origin (a synthetic table says
so in its caption and file name), number of seeds and rounds; a row whose runs train with
other hyper-parameters than the study's ``train`` (``method_train``, a setting's ``train`` or
``method_train``) is marked, with a note naming the keys: ``† lr 0.1 (study: 0.01)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.report import origin as origin_note
from fedmedbench.workflow import io

KEYS = ["dataset", "setting", "method"]
#: the marks of rows trained with other hyper-parameters than the study's, one per distinct difference (then doubled)
MARKS = ("†", "‡", "§", "¶")
#: setting -> method -> train key -> [the runs' value, the study's] (``studies/grid.py``: ``train_overrides``)
Overrides = dict[str, dict[str, dict[str, list]]]


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


def _plain(value) -> str:
    """A config value as the YAML config writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def override_text(diff: dict[str, list]) -> str:
    """``lr 0.1 (study: 0.01), momentum 0.9 (study: 0.0)``: the keys in name order."""
    return ", ".join(f"{k} {_plain(run)} (study: {_plain(study)})" for k, (run, study) in sorted(diff.items()))


def override_notes(table: pd.DataFrame, overrides: Overrides | None) -> tuple[list[str], list[str], dict[str, str]]:
    """Per row: its note ('' where it trains as the study) and its mark; and mark -> note, in row order (rows with
    the same differences share a mark)."""
    texts, marks, by_text = [], [], {}
    for setting, method in zip(table["setting"], table["method"], strict=True):
        diff = ((overrides or {}).get(setting) or {}).get(method)
        text = override_text(diff) if diff else ""
        if text and text not in by_text:
            i = len(by_text)
            by_text[text] = MARKS[i % len(MARKS)] * (i // len(MARKS) + 1)
        texts.append(text)
        marks.append(by_text.get(text, ""))
    return texts, marks, {mark: text for text, mark in by_text.items()}


def display_frame(table: pd.DataFrame, metrics: list[str], marks: list[str] | None = None) -> pd.DataFrame:
    shown = table[KEYS + ["n_seeds"]].copy()
    if marks is not None:
        shown["method"] = [f"{m} {mark}" if mark else m for m, mark in zip(shown["method"], marks, strict=True)]
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


def write_tables(table: pd.DataFrame, runs: pd.DataFrame, outputs, study: str, origin: str,
                 overrides: Overrides | None = None) -> None:
    """The table as CSV (its notes in column ``train_overrides``), Markdown (marked rows, a note under the table
    for each mark) and LaTeX (marked rows, the notes in the caption). ``overrides``: :data:`Overrides`."""
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    cap = caption(study, runs, origin)
    texts, marks, notes = override_notes(table, overrides)
    io.write_csv(outputs.csv, table.assign(train_overrides=texts))
    shown = display_frame(table, metrics, marks)
    lines = "".join(f"\n{mark} {text}\n" for mark, text in notes.items())
    io.write_text(outputs.md, f"{cap}\n\n{shown.to_markdown(index=False)}\n{lines}")
    tex_cap = " ".join([cap, *(f"{mark} {text}." for mark, text in notes.items())])
    latex = shown.to_latex(index=False, caption=tex_cap.replace("%", r"\%"), label=f"tab:{study}", escape=True)
    io.write_text(outputs.tex, latex)
