"""Snakemake entry: video-level splits and the client settings of one group (UltraFlwr G_combined/G_track20)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.data.surgical.group_io import write_group
from fedmedbench.data.surgical.recurate import build_group
from fedmedbench.data.surgical.schema import read_index
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    loaded = {name: read_index(path) for name, path in snakemake.input.items()}
    group = build_group(snakemake.wildcards.sgroup, {k: v[0] for k, v in loaded.items()},
                        {k: v[1] for k, v in loaded.items()}, snakemake.params.group, snakemake.params.tool_groups)
    write_group(group, snakemake.output[0], snakemake.params.origin)
    for st in group.settings.values():
        frames = [sum(group.lengths[v] for v in c) for c in st.train]
        log(f"{group.name}/{st.name} ({st.scheme}): training frames per client {frames}, "
            f"{len(group.unused(st))} unused video(s)")
