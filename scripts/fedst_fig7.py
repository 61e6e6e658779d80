"""Snakemake entry: FedST Fig. 7 (each method with and without synthetic data mixed into the
sites, iterations doubled) as csv + png."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench import io
from fedmedbench.report import fedst as R
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    p = snakemake.params
    frame = R.fig7_frame(list(snakemake.input.clients), list(p.sites), list(p.methods))
    io.write_csv(snakemake.output.csv, frame)
    io.save_figure(snakemake.output.fig, R.fig7_plot(frame, p.origin))
    log(f"fig7: {frame['method'].nunique()} methods")
    log("done")
