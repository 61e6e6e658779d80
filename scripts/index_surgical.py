"""Snakemake entry: one surgical dataset in its release layout -> the frame index (+ bad-file report)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data.surgical.index import build_index
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    cfg = snakemake.params.dataset
    build_index(snakemake.wildcards.sdataset, cfg, snakemake.params.root, snakemake.output[0], policy=cfg["bad_files"],
                origin=snakemake.params.origin, log=log)
