"""The paper's numbers beside the run's: one column per reported value, plus a difference.

Each study types its paper's tables into ``config/paper_values/<study>.yaml``::

    paper: "Lee et al., 2025"            # who reported the numbers
    tables:
      table1:                            # a name the study's report code uses
        source: "Table 1"                # where in the paper
        keys: [setting, method]          # the columns that identify a row
        rows:
          - {setting: dir0.1, method: fedavg, accuracy: 71.2}

Values are written as printed in the paper (usually percent). :func:`beside` adds
``<metric> (paper)`` and ``<metric> Δ`` (run minus paper) columns to a table of the run's
numbers; on synthetic data the layout is kept but the difference is left empty, since a
synthetic number is no attempt at the paper's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

#: Where the typed-in paper values live, relative to the workflow's root.
DEFAULT_ROOT = Path("config") / "paper_values"


@dataclass(frozen=True)
class PaperTable:
    """One table of a paper: where it is printed, which columns identify a row, its rows."""

    paper: str
    source: str
    keys: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]

    def lookup(self, key: dict[str, Any], metric: str) -> float:
        """The paper's value for ``metric`` in the row matching ``key`` (NaN if not printed)."""
        for row in self.rows:
            if all(str(row.get(k)) == str(key.get(k)) for k in self.keys):
                value = row.get(metric)
                return math.nan if value is None else float(value)
        return math.nan


def load(study: str, table: str, root: str | Path = DEFAULT_ROOT) -> PaperTable | None:
    """The paper's ``table`` for ``study``, or None when no values were typed in for it."""
    path = Path(root) / f"{study}.yaml"
    if not path.is_file():
        return None
    doc = yaml.safe_load(path.read_text()) or {}
    spec = (doc.get("tables") or {}).get(table)
    if spec is None:
        return None
    for field in ("source", "keys", "rows"):
        if field not in spec:
            raise ValueError(f"{path}: tables.{table} has no '{field}'")
    return PaperTable(paper=str(doc.get("paper", "")), source=str(spec["source"]),
                      keys=tuple(spec["keys"]), rows=tuple(spec["rows"]))


def beside(frame: pd.DataFrame, paper: PaperTable | None, metrics: dict[str, str], synthetic: bool) -> pd.DataFrame:
    """Add the paper's value and the difference after each of the run's metric columns.

    ``metrics`` maps a numeric column of ``frame`` (in the paper's units) to the metric's
    name in the paper table. Rows the paper does not print get NaN. With ``synthetic``
    the difference column is present but empty.
    """
    out = frame.copy()
    missing = [k for k in (paper.keys if paper else ()) if k not in out.columns]
    if missing:
        raise KeyError(f"paper table {paper.source!r} is keyed by {missing}, which the table lacks")
    for column, name in metrics.items():
        if paper is None:
            values = [math.nan] * len(out)
        else:
            values = [paper.lookup(row, name) for row in out[list(paper.keys)].to_dict("records")]
        at = out.columns.get_loc(column) + 1
        out.insert(at, f"{column} (paper)", values)
        diff = [math.nan] * len(out) if synthetic else (out[column].astype(float) - pd.Series(values, index=out.index))
        out.insert(at + 1, f"{column} Δ", diff)
    return out


def note(paper: PaperTable | None, synthetic: bool) -> str:
    """One caption sentence saying where the paper column comes from."""
    if paper is None:
        return "Paper values: none typed in for this table."
    text = f"Paper values: {paper.paper}, {paper.source}."
    if synthetic:
        text += " The difference column is left empty: synthetic data is no attempt at the paper's numbers."
    return text
