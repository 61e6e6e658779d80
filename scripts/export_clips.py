"""Snakemake entry: FedST clip index (current + previous frames) and site metadata for every site."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data.surgical import facts
from fedmedbench.data.surgical.export_clips import export_sites, labelled_frames
from fedmedbench.data.surgical.schema import read_index
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    indices = {name: read_index(path) for name, path in snakemake.input.items()}
    summary = export_sites(indices, snakemake.params.sites, snakemake.params.clips, snakemake.output[0],
                           snakemake.params.origin)
    for site, info in summary["sites"].items():
        log(f"site {site} ({info['dataset']}, {info['role']}): {info['counts']}")
        if snakemake.params.origin == "real":  # FedST Table I's counts, for users to check their copy (docs/fedst.md)
            release = snakemake.params.releases[info["dataset"]]
            for line in facts.table_i_check(site, release, labelled_frames(info["counts"])):
                log.console(f"WARNING: {line}")
