"""Snakemake entry: one study table's Markdown (rounded as in the paper) as an HTML page for the report."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from pathlib import Path

from fedmedbench.workflow import io
from fedmedbench.report.html import markdown_to_html
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w = snakemake.wildcards
    text = Path(snakemake.input[0]).read_text()
    io.write_text(snakemake.output[0], markdown_to_html(text, f"{w.study}: {w.table}"))
    log(f"{snakemake.input[0]} -> {snakemake.output[0]}")
