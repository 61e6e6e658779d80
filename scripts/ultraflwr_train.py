"""Snakemake entry: one UltraFlwr run (one strategy, or the per-client centralized baseline)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
import pandas as pd

from fedmedbench import io
from fedmedbench.compat import limit_threads
from fedmedbench.fl.spec import RunSpec, engine_options
from fedmedbench.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    # the backend changes how messages travel, not the results: read from config, not params (as
    # scripts/train_federated.py), so switching it does not rerun finished jobs; inline = no Ray
    spec = RunSpec.from_dict({**snakemake.params.spec, **engine_options(snakemake.config)})
    spec = weights.pin(spec, snakemake.input.weights)  # the loaded file is the fetched one (hash in the run hash)
    if snakemake.wildcards.strategy == "Centralized":
        from fedmedbench.fl.detection.centralized import run_centralized

        mp = spec.method_params
        run_centralized(spec, select=mp.get("select", "best"), select_metric=mp.get("select_metric", "map50"),
                        ultralytics=mp.get("ultralytics"), log=log)
        io.write_csv(snakemake.output.comm, pd.DataFrame(columns=["round", "client", "bytes_sent"]))
    else:
        from fedmedbench.fl import engine

        federation = engine.run(spec, log=log)
        rows = federation.final_state.server_state.get("ultraflwr_clients", [])
        io.write_csv(snakemake.output.comm, pd.DataFrame(rows))
    log("done")
