"""Snakemake entry: one surgical dataset in its release layout -> the frame index (+ bad-file report)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data.surgical import facts
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import read_index
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    cfg = snakemake.params.dataset
    build_index(snakemake.wildcards.sdataset, cfg, snakemake.params.root, snakemake.output[0], policy=cfg["bad_files"],
                origin=snakemake.params.origin, log=log)
    line = facts.report(cfg["layout"], read_index(snakemake.output[0])[0])
    if line:  # the published counts, for users to check their copy (docs/ultraflwr.md)
        log(f"{snakemake.wildcards.sdataset}: {line}")
