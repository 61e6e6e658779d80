"""Snakemake entry: a study's seeds of one dataset, setting and method trained side by side in one process."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from contextlib import ExitStack

from fedmedbench.compat import limit_threads
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine.runs_together import run_together
from fedmedbench.fl.spec import for_job
from fedmedbench.workflow.runlock import run_lock
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    log_every = snakemake.config["studies"][snakemake.wildcards.study]["log_every"]
    # as scripts/train_federated.py: threads, log_every, backend, keep_checkpoints, resume from the job and config
    specs = [weights.pin(for_job(p, snakemake.threads, snakemake.config, log_every=log_every), snakemake.input.weights)
             for p in snakemake.params.specs.values()]
    with ExitStack() as locks:
        for spec in specs:
            locks.enter_context(run_lock(spec.run_dir, log=snakemake.log[0]))  # a second process refuses each of these runs
        run_together(specs, log=log)
        for spec in specs:
            engine.complete(spec, log=log)
    log("done")
