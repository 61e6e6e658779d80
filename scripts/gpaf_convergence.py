"""Snakemake entry: rounds to reach a target accuracy (table) and the GPAF convergence figure."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.studies.gpaf import report as gpaf
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, r, out = snakemake.wildcards, snakemake.params.report, snakemake.output
    curves = gpaf.load_curves(snakemake.input, snakemake.params.setting_order)
    table = gpaf.rounds_to_target(curves, r["convergence_metric"], r["target"], r["target_fraction"], r["reference_method"],
                                  r["method_order"])
    gpaf.write_rounds_table(table, out.csv, out.md, study=w.study, origin=snakemake.params.origin,
                            reference=r["reference_method"])
    fig = gpaf.convergence_figure(curves, table, r["convergence_metric"], w.study, snakemake.params.origin, r["method_order"],
                                  r["fig5a_metric"])
    io.save_figure(out.figure, fig)
    log(f"rounds to target for {len(table)} (dataset, setting, method) rows")
