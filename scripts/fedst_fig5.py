"""Snakemake entry: FedST Fig. 5 (test Dice vs round: SERQ vs synthetic fine-tuning on the
server vs synthetic data at the sites) as csv + png."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench import io
from fedmedbench.report import fedst as R
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    p = snakemake.params
    frame = R.fig5_frame(list(snakemake.input.clients), list(p.sites))
    io.write_csv(snakemake.output.csv, frame)
    io.save_figure(snakemake.output.fig, R.fig5_plot(frame, p.origin))
    log(f"fig5: {frame['curve'].nunique()} curves, {frame['round'].nunique()} evaluated rounds")
    log("done")
