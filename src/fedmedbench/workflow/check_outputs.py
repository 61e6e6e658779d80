"""The outputs of a config that are missing, folder by folder (``make check``).

Snakemake reruns a job whose output is missing only when a job downstream needs that output: a
finished run whose ``model.pt`` (read by no rule) or whole folder (whose tables are already built)
was deleted leaves ``snakemake -n`` saying "Nothing to be done". Snakemake's ``--summary`` lists every
output of the DAG with its status; this lists the missing ones by folder and the rule that writes
them, and how to build them again (name a missing file as the target).

``python -m fedmedbench.workflow.check_outputs [--configfile FILE ...]``: exit status 1 when an output
is missing, 0 when every one is there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: the first column of the header line of ``snakemake --summary``
HEADER = "output_file"
MISSING = "missing"


@dataclass(frozen=True)
class Output:
    path: str
    rule: str
    status: str


def parse_summary(text: str) -> list[Output]:
    """The rows of ``snakemake --summary`` (tab-separated: output_file, date, rule, log-file(s), status, plan)."""
    rows, columns = [], None
    for line in text.splitlines():
        cells = line.split("\t")
        if columns is None:
            if cells[0] == HEADER:
                columns = {name: i for i, name in enumerate(cells)}
            continue
        if len(cells) == len(columns):
            rows.append(Output(cells[columns[HEADER]], cells[columns["rule"]], cells[columns["status"]]))
    if columns is None:
        raise ValueError("snakemake --summary printed no table (its header line 'output_file ...' is missing)")
    return rows


def summary(configfiles: Sequence[str], cwd: str | Path = ".") -> list[Output]:
    """Every output of the workflow under ``configfiles`` (the default config when empty), as Snakemake sees it."""
    cmd = [sys.executable, "-m", "snakemake", "--summary", "--quiet"]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:  # a config error: Snakemake's (or the workflow's) own line says which
        raise SystemExit(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"{' '.join(cmd)} failed")
    return parse_summary(proc.stdout)


def missing_by_folder(outputs: Sequence[Output]) -> dict[tuple[str, str], list[str]]:
    """(folder, rule) -> the names of its missing outputs, in the summary's order."""
    found: dict[tuple[str, str], list[str]] = {}
    for out in outputs:
        if out.status == MISSING:
            path = Path(out.path)
            found.setdefault((str(path.parent), out.rule), []).append(path.name)
    return found


def report(outputs: Sequence[Output], configfiles: Sequence[str]) -> tuple[list[str], int]:
    """The lines to print and the exit status (1 when an output is missing)."""
    missing = missing_by_folder(outputs)
    if not missing:
        return [f"all {len(outputs)} outputs are present"], 0
    lines = [f"{folder} ({rule}): {', '.join(names)} missing" for (folder, rule), names in missing.items()]
    count = sum(len(names) for names in missing.values())
    (folder, _), names = next(iter(missing.items()))
    config = "".join(f" --configfile {f}" for f in configfiles) + (" --" if configfiles else "")
    lines.append(f"{count} of {len(outputs)} outputs missing in {len(missing)} folder(s); `snakemake -n` reruns "
                 f"none whose outputs nothing downstream reads: name a missing file as the target, e.g. "
                 f"snakemake{config} {folder}/{names[0]}")
    return lines, 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", nargs="*", default=[], help="the config files (default: config/config.yaml)")
    args = parser.parse_args(argv)
    lines, status = report(summary(args.configfile), args.configfile)
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
