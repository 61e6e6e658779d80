"""Snakemake entry: t-SNE of client, global (and GPAF generator) latent features per class, one panel per method."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.compat import limit_threads
from fedmedbench.studies.gpaf import report as gpaf
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    w, p = snakemake.wildcards, snakemake.params
    panels = gpaf.tsne_panels(dict(p.specs), dict(p.tsne))
    first = next(iter(p.specs.values()))
    seed, kept = first["seed"], first["client_models_round"] or first["train"]["rounds"]
    tag = " — SYNTHETIC data (not a paper reproduction)" if p.origin == "synthetic" else ""
    title = f"{w.study} {w.dataset}/{w.setting}: t-SNE of latent features, round {kept}, seed {seed}{tag}"
    io.save_figure(snakemake.output[0], gpaf.tsne_figure(panels, title))
    log(f"t-SNE of {', '.join(panels)}")
