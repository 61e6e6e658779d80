"""Snakemake entry: synthetic surgical videos written in the real release layouts (demo/test data, not real)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from pathlib import Path

from fedmedbench.workflow import io
from fedmedbench.data.surgical import synthetic_layouts
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    spec = snakemake.params.spec
    syn, datasets = spec["synthetic"], spec["datasets"]
    folders = {Path(p).name: Path(p) for p in snakemake.output.folders}
    for name in sorted(datasets):
        cfg = datasets[name]
        out = folders[cfg["folder"]]
        synthetic_layouts.generate(name, cfg, syn["datasets"][name], syn["seed"], syn["width"], syn["height"], out)
        log(f"SYNTHETIC {name}: {cfg['layout']} layout in {out}")
    io.write_json(snakemake.output.marker, {"origin": "synthetic", "note": "NOT real data; never a paper reproduction",
                                            **spec})
