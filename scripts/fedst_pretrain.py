"""Snakemake entry: FedST's synthetic pre-training (the initial model of every site and of SERQ)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.compat import limit_threads
from fedmedbench.studies.fedst.pretrain import pretrain
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    for name, digest in weights.verify_manifests(snakemake.input.weights).items():
        log(f"weights {name}: sha256 {digest} (verified against its manifest)")
    pretrain(dict(snakemake.params.pre), int(snakemake.wildcards.seed), snakemake.output[0],
             device=snakemake.params.device, log=log, loader_workers=int(snakemake.config["engine"].get("loader_workers", 0)),
             image_cache=snakemake.config["engine"].get("image_cache"))
    log("done")
