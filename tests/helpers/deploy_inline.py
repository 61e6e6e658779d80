"""The deployed ServerApp and ClientApp in one process: every message serialised as over the network.

Each node has the node config a SuperNode would have (its own ``partition-id``, ``data-dir``
and ``state-dir``); the server runs :func:`fedmedbench.deploy.apps.run_server` on an
:class:`~fedmedbench.fl.engine.inline_grid.InlineGrid` with ``wire=True``.
"""

from __future__ import annotations

from pathlib import Path

from fedmedbench.deploy import apps
from fedmedbench.deploy.site_data import site_folder
from fedmedbench.fl.engine.inline_grid import InlineGrid
from fedmedbench.fl.spec import RunSpec


def run_inline(server_spec: RunSpec, sites: Path, states: Path, num_sites: int) -> None:
    grid = InlineGrid(apps.client_app, num_sites, seed=server_spec.seed, wire=True)
    for ctx in grid.contexts.values():
        pid = int(ctx.node_config["partition-id"])
        ctx.node_config = {"partition-id": pid, "data-dir": str(site_folder(sites, pid)), "state-dir": str(states / f"site{pid}")}
        ctx.run_config = {"server-spec-file": "", "round-timeout-s": 60}
    apps.run_server(grid, server_spec, 60, log=lambda m: None)
