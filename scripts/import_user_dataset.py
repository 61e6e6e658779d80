"""Snakemake entry: a user's own MedMNIST-layout npz, checked against its `datasets:` entry, copied in."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data import user
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0], config_key=f"datasets.{snakemake.wildcards.dataset}") as log:
    w, entry = snakemake.wildcards, snakemake.params.entry
    counts = user.import_file(entry, int(w.size), snakemake.output.npz, expect_sha256=snakemake.params.source["sha256"])
    log(f"user dataset {w.dataset} ({user.origin_label(entry, int(w.size))}): {len(entry['labels'])} classes, {counts}")
