"""Snakemake entry for FedST Figs. 5-7 (csv + png each): Fig. 5 test Dice vs round (SERQ vs synthetic
fine-tuning on the server vs synthetic data at the sites), Fig. 6 test Dice vs communication interval,
Fig. 7 each method with and without synthetic data mixed into the sites (iterations doubled)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.studies.fedst import report as R
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    p, clients, rule = snakemake.params, list(snakemake.input.clients), snakemake.rule
    if rule == "fedst_fig5":
        frame, plot, what = R.fig5_frame(clients, list(p.sites)), R.fig5_plot, "curve"
    elif rule == "fedst_fig6":
        frame, plot, what = R.fig6_frame(clients, list(p.sites), int(p.base_steps)), R.fig6_plot, "interval"
    elif rule == "fedst_fig7":
        frame, plot, what = R.fig7_frame(clients, list(p.sites), list(p.methods)), R.fig7_plot, "method"
    else:
        raise ValueError(f"unknown rule {rule}")
    io.write_csv(snakemake.output.csv, frame)
    io.save_figure(snakemake.output.fig, plot(frame, p.origin))
    log(f"{rule}: {frame[what].nunique()} {what}(s)")
    log("done")
