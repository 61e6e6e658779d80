"""Snakemake entry: official MedMNIST npz (verified local folder or MD5-checked download)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data import medmnist
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    medmnist.fetch(w.dataset, int(w.size), snakemake.output[0], root=p.root, retries=p.retries, timeout=p.timeout, log=log)
    log(f"verified {snakemake.output[0]}")
