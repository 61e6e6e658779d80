"""Snakemake entry: a run's site folders (site-XX/) and the server's spec (server/spec.json).

The server's spec is the spec the simulation job of the same run trains with (its threads, its
weight files' hashes, FedST's pinned initial model), so the deployed run reproduces it."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.deploy.export import export_run
from fedmedbench.fl.spec import for_job
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    spec = for_job(snakemake.params.spec, snakemake.config["threads"]["train"], snakemake.config)
    spec = weights.pin(spec, list(snakemake.input.weights))
    if spec.task == "segmentation":
        from fedmedbench.studies.fedst.runs import pin_initial_model

        spec = pin_initial_model(spec)
    for path in export_run(spec, snakemake.output[0]):
        log(f"wrote {path}")
