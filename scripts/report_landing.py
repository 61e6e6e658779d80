"""Snakemake entry: the report's first page (each study's paper, data origin and main table) as an HTML fragment."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from pathlib import Path

from fedmedbench.workflow import io
from fedmedbench.report.landing import StudyEntry, landing_html
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    studies = [StudyEntry(**s) for s in snakemake.params.studies]
    tables = {str(p): Path(p).read_text() for p in snakemake.input}
    io.write_text(snakemake.output[0], landing_html(studies, tables, snakemake.params.data_category))
    log(f"{len(studies)} studies, {len(tables)} main tables -> {snakemake.output[0]}")
