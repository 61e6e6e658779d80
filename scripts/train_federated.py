"""Snakemake entry: one federated (or local / centralized) training job on Flower."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.compat import limit_threads
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import for_job
from fedmedbench.workflow.runlock import run_lock
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    # threads, log_every, backend, keep_checkpoints, resume change how the job runs, not its results:
    # from the job and config, not params, so changing them reruns no finished job
    spec = for_job(snakemake.params.spec, snakemake.threads, snakemake.config,
                   log_every=snakemake.config["studies"][snakemake.wildcards.study]["log_every"])
    spec = weights.pin(spec, snakemake.input.weights)  # the loaded file is the fetched one (hash in the run hash)
    with run_lock(spec.run_dir, log=snakemake.log[0]):  # a second process (e.g. after --unlock) refuses this run
        engine.run(spec, log=log)
        engine.complete(spec, log=log)
        log("done")
