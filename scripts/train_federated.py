"""Snakemake entry: one federated (or local / centralized) training job on Flower."""
from fedmedbench.compat import limit_threads
from fedmedbench.fl import engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    spec = RunSpec.from_dict(dict(snakemake.params.spec))
    engine.run(spec, log=log)
    log("done")
