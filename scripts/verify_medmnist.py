"""Snakemake entry: check the MD5 of an official MedMNIST npz, however it got into resources/medmnist/
(downloaded, copied from data.medmnist_root, or placed there by hand), and write its .verified marker."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.data import medmnist
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w = snakemake.wildcards
    md5 = medmnist.verify_official(snakemake.input[0], w.dataset, int(w.size))
    io.write_json(snakemake.output[0], {"file": snakemake.input[0], "md5": md5,
                                        "origin": f"official MedMNIST {medmnist.official_filename(w.dataset, int(w.size))}"})
    log(f"verified {snakemake.input[0]} (MD5 {md5})")
