"""Snakemake entry: mean ± std over seeds -> CSV, Markdown and LaTeX tables."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.report import tables
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    runs = tables.load_summaries(snakemake.input)
    table = tables.aggregate(runs, snakemake.params.metrics)
    tables.write_tables(table, runs, snakemake.output, study=snakemake.wildcards.study, origin=snakemake.params.origin,
                        overrides=snakemake.params.overrides)
    log(f"{len(runs)} runs -> {len(table)} rows")
