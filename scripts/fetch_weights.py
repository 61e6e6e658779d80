"""Snakemake entry: fetch one named weight set into resources/weights/<name>/ (docs/weights.md)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import layout
from fedmedbench.weights.fetch import fetch

with log_to(snakemake.log[0]) as log:
    name = snakemake.wildcards.wname
    # where the file comes from (mirror, offline path) is read from config, not params: switching
    # to a mirror or a local copy of the same file does not refetch it or rerun training
    entry = layout.weight_sets(snakemake.config.get("weights"), snakemake.params.catalogue)[name]
    fetch(name, entry, out_dir=layout.folder(name), log=log)
    log("done")
