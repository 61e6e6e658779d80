"""Snakemake entry: the clients' imaging domains side by side (GPAF Fig. 2), figure and intensity profiles."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.data import medmnist
from fedmedbench.studies.gpaf import domains as report
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    data = {name: medmnist.load_npz(path) for name, path in zip(p.domains, snakemake.input, strict=True)}
    profiles = report.intensity_profiles(data, split="train", bins=p.bins)
    io.write_csv(snakemake.output.csv, profiles)
    tag = " — SYNTHETIC data (not a paper reproduction)" if p.origin == "synthetic" else ""
    title = f"{w.study} {w.dataset}/{w.setting}: pixel intensities per client and class, train split{tag}"
    names = medmnist.dataset_info(w.dataset).class_names
    io.save_figure(snakemake.output.figure, report.domain_figure(data, profiles, title, names))
    log(f"intensity profiles of {len(data)} domains: {', '.join(data)}")
