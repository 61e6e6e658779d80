"""Snakemake entry: FedST Fig. 6 (test Dice vs communication interval) as csv + png."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench import io
from fedmedbench.report import fedst as R
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    p = snakemake.params
    frame = R.fig6_frame(list(snakemake.input.clients), list(p.sites), int(p.base_steps))
    io.write_csv(snakemake.output.csv, frame)
    io.save_figure(snakemake.output.fig, R.fig6_plot(frame, p.origin))
    log(f"fig6: {frame['interval'].nunique()} intervals")
    log("done")
