"""Snakemake entry: convergence curves (mean ± std over seeds) for a study."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.report import figures
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]):
    curves = figures.load_curves(snakemake.input)
    fig = figures.convergence(curves, snakemake.params.metric, study=snakemake.wildcards.study, origin=snakemake.params.origin)
    io.save_figure(snakemake.output[0], fig)
