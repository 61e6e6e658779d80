"""Snakemake entry: a MedMNIST-C client domain (medmnistc corruptions) of a MedMNIST file."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.data import domains, medmnist
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w = snakemake.wildcards
    data = medmnist.load_npz(snakemake.input[0])
    out = domains.corrupt_dataset(data, w.dataset, w.domain, snakemake.params.steps, seed=snakemake.params.seed)
    io.write_npz(snakemake.output[0], medmnist.to_official_arrays(out))
    log(f"domain {w.domain}: {len(snakemake.params.steps)} corruption step(s) applied to {snakemake.input[0]}")
