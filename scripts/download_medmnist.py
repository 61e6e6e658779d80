"""Snakemake entry: official MedMNIST npz (verified local folder or MD5-checked download)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data import medmnist
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, data = snakemake.wildcards, snakemake.config["data"]
    medmnist.fetch(w.dataset, int(w.size), snakemake.output[0], root=data["medmnist_root"],
                   retries=data["download"]["retries"], timeout=data["download"]["timeout_s"], log=log)
    log(f"verified {snakemake.output[0]}")
