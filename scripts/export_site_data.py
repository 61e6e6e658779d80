"""Snakemake entry: a run's site folders (site-XX/) and the server's spec (server/spec.json)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.deploy.export import export_run
from fedmedbench.fl.spec import RunSpec
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    spec = RunSpec.from_dict(snakemake.params.spec)
    for path in export_run(spec, snakemake.output[0]):
        log(f"wrote {path}")
