"""Planning speed: ``snakemake -n`` for the demo config and every full study grid, with job counts.

    python bench/planning.py [--out bench/results.jsonl]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import emit  # noqa: E402


def plan(configfile: Path) -> dict:
    snakemake = Path(sys.executable).with_name("snakemake")
    cmd = [str(snakemake), "-n", "--quiet", "rules", "--cores", "2", "--configfile", str(configfile)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"planning {configfile} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    total = re.search(r"^total\s+(\d+)", proc.stdout + proc.stderr, re.M)
    return {"bench": "planning", "config": str(configfile.relative_to(ROOT)), "jobs": int(total.group(1)) if total else 0,
            "seconds": round(seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    configs = [ROOT / "config" / "config.yaml", *sorted((ROOT / "config" / "studies").glob("*.yaml"))]
    rows = [plan(c) for c in configs]
    emit(rows, args.out)


if __name__ == "__main__":
    main()
