"""Snakemake entry: early-stopping Figure 3 (curves + stopping points) and Figure 4 (metric vs tau)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.report import figures
from fedmedbench.studies.earlystop import report as earlystop
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]):
    p = snakemake.params
    es = p.es
    curves = figures.load_curves(snakemake.input.metrics)
    points = earlystop.load_points(snakemake.input.points)
    io.save_figure(snakemake.output.fig3, earlystop.figure3(curves, points, es["figure3_method"], p.setting, es["tau"],
                                                            es["patience"], es["metric"], p.origin, es["counting"]))
    io.save_figure(snakemake.output.fig4, earlystop.figure4(points, p.setting, list(es["taus"]), list(p.methods),
                                                            es["metric"], p.origin))
