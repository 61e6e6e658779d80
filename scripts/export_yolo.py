"""Snakemake entry: per-client YOLO datasets (symlinked images, label files, data.yaml) of every setting of a group."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data.surgical.export_yolo import export_group
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    manifests = export_group(snakemake.input[0], snakemake.output[0])
    for setting, m in manifests.items():
        log(f"{setting}: " + ", ".join(f"client {c['client']} train {c['counts']['train']['frames']} frames"
                                       for c in m["clients"]))
