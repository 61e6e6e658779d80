"""Snakemake entry: a run trained in another setting, shown in this one (fedmedbench.studies.grid.show_run)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from pathlib import Path

from fedmedbench.workflow.runlog import log_to
from fedmedbench.studies import grid

with log_to(snakemake.log[0]) as log:
    home = Path(snakemake.input.summary_json).parent
    grid.show_run(home, Path(snakemake.output.summary).parent, snakemake.params.setting)
    log(f"shown from {home} (trained once: same pooled inputs)")
