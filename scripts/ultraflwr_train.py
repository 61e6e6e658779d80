"""Snakemake entry: one UltraFlwr run (one strategy, or the per-client centralized baseline)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
import pandas as pd

from fedmedbench.workflow import io
from fedmedbench.compat import limit_threads
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import for_job
from fedmedbench.workflow.runlock import run_lock
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    # runtime fields (threads, backend, ...) from the job and config, not params (as scripts/train_federated.py),
    # so changing them reruns no finished job; inline = no Ray
    spec = for_job(snakemake.params.spec, snakemake.threads, snakemake.config)
    spec = weights.pin(spec, snakemake.input.weights)  # the loaded file is the fetched one (hash in the run hash)
    with run_lock(spec.run_dir, log=snakemake.log[0]):  # a second process (e.g. after --unlock) refuses this run
        if snakemake.wildcards.strategy == "Centralized":
            from fedmedbench.fl.tasks.detection.centralized import OPTIONS, run_centralized

            run_centralized(spec, log=log, **{k: v for k, v in spec.method_params.items() if k in OPTIONS})
            io.write_csv(snakemake.output.comm, pd.DataFrame(columns=["round", "client", "bytes_sent"]))
        else:
            federation = engine.run(spec, log=log)
            rows = federation.final_state.server_state.get("ultraflwr_clients", [])
            io.write_csv(snakemake.output.comm, pd.DataFrame(rows))
        engine.complete(spec, log=log)  # every output written: the stage's links and Ultralytics' folders go
        log("done")
