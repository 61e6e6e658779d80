"""Per-rule breakdown of the last ``make demo`` from Snakemake's ``benchmark:`` files.

Jobs run 2 at a time (``--cores 2``), so the summed job seconds exceed the wall time. ``cpu_s`` is
Snakemake's ``cpu_time``: the job's CPU seconds at its last poll (every 0.5 s for the first 15 s,
then every 30 s), so a lower bound; a 26 s job reads about 15 s. Wall seconds (``total_s``) are the
measure of a job's cost.

    python bench/demo_breakdown.py [--benchmarks benchmarks] [--out bench/results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import append_lines  # noqa: E402


def breakdown(root: Path) -> pd.DataFrame:
    rows = []
    for tsv in root.rglob("*.tsv"):
        rule = tsv.relative_to(root).parts[0].removesuffix(".tsv")
        first = pd.read_csv(tsv, sep="\t").iloc[0]
        rows.append({"rule": rule, "s": float(first["s"]), "cpu_s": float(first["cpu_time"]), "max_rss_mb": float(first["max_rss"])})
    if not rows:
        raise SystemExit(f"no benchmark files under {root}: run `make demo` first")
    df = pd.DataFrame(rows)
    out = df.groupby("rule").agg(jobs=("s", "size"), total_s=("s", "sum"), mean_s=("s", "mean"), max_s=("s", "max"),
                                 cpu_s=("cpu_s", "sum"), max_rss_mb=("max_rss_mb", "max"))
    return out.sort_values("total_s", ascending=False).round(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmarks", type=Path, default=Path("benchmarks"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    table = breakdown(args.benchmarks)
    print(table.to_markdown())
    print(f"\n{int(table['jobs'].sum())} jobs, {table['total_s'].sum():.0f} job-seconds")
    if args.out:  # through a temp file and a rename: a stopped run leaves the file as it was
        append_lines(args.out, [json.dumps({"bench": "demo_rule", "rule": rule, **r.to_dict()})
                                for rule, r in table.iterrows()])


if __name__ == "__main__":
    main()
