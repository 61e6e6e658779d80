"""`--cores 1` runs one job at a time (Snakemake 9.16 started two after a lone ready job; fixed in 9.17).

A shared upstream job followed by several ready jobs is the pattern that over-committed cores: the
lone job's cores were returned to the pool without having been taken. Start and end of every job
come from its ``benchmark:`` file (end = file time, start = end - measured seconds).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SNAKEFILE = """
rule all:
    input: expand("out/{i}.txt", i=range(3))

rule prepare:
    output: "out/common"
    benchmark: "bench/prepare.tsv"
    shell: "sleep 0.5; touch {output}"

rule work:
    input: "out/common"
    output: "out/{i}.txt"
    benchmark: "bench/work_{i}.tsv"
    threads: 1
    shell: "sleep 1.5; touch {output}"
"""


def job_intervals(bench: Path) -> list[tuple[float, float, str]]:
    out = []
    for f in sorted(bench.glob("*.tsv")):
        end = f.stat().st_mtime
        seconds = float(pd.read_csv(f, sep="\t")["s"].iloc[0])
        out.append((end - seconds, end, f.stem))
    return sorted(out)


def overlaps(intervals: list[tuple[float, float, str]], slack: float = 0.2) -> list[tuple[str, str]]:
    """Pairs of jobs that ran at the same time (beyond ``slack`` seconds of timing noise)."""
    return [(a[2], b[2]) for a, b in itertools.pairwise(intervals) if b[0] < a[1] - slack]


def test_overlap_detector_on_hand_made_intervals():
    assert overlaps([(0.0, 2.0, "a"), (2.05, 4.0, "b")]) == []
    assert overlaps([(0.0, 2.0, "a"), (1.0, 3.0, "b")]) == [("a", "b")]


@pytest.mark.slow
def test_cores_1_never_runs_two_jobs_at_once(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--workflow-profile", "none"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    intervals = job_intervals(tmp_path / "bench")
    assert len(intervals) == 4
    assert overlaps(intervals) == [], f"jobs ran concurrently under --cores 1: {intervals}"
