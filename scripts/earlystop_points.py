"""Snakemake entry: stopping points of every early-stopping rule, per run and tau."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.report import figures
from fedmedbench.studies.earlystop import report as earlystop
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    p = snakemake.params
    points = earlystop.stopping_points(figures.load_curves(snakemake.input), list(p.taus), int(p.patience), p.metric,
                                       p.min_delta, p.counting, p.never_fired)
    io.write_csv(snakemake.output[0], points)
    log(f"{points[['dataset', 'setting', 'method', 'seed']].drop_duplicates().shape[0]} runs x {len(p.taus)} taus")
