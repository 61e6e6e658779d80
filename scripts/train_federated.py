"""Snakemake entry: one federated (or local / centralized) training job on Flower."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.compat import limit_threads
from fedmedbench.fl import engine
from fedmedbench.fl.spec import RunSpec, engine_options
from fedmedbench.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    # the backend changes how messages travel, not the results: read from config, not params,
    # so switching it does not rerun finished jobs
    spec = RunSpec.from_dict({**snakemake.params.spec, **engine_options(snakemake.config)})
    spec = weights.pin(spec, snakemake.input.weights)  # the loaded file is the fetched one (hash in the run hash)
    engine.run(spec, log=log)
    log("done")
