"""Snakemake entry: FedST clip index (current + previous frames) and site metadata for every site."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data.surgical.export_clips import export_sites
from fedmedbench.data.surgical.schema import read_index
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    indices = {name: read_index(path) for name, path in snakemake.input.items()}
    summary = export_sites(indices, snakemake.params.sites, snakemake.params.clips, snakemake.output[0],
                           snakemake.params.origin)
    for site, info in summary["sites"].items():
        log(f"site {site} ({info['dataset']}, {info['role']}): {info['counts']}")
