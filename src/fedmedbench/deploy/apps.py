"""The Flower App a real deployment runs: the simulation's Federation and client code over a SuperLink.

``server_app`` runs on the coordinating machine (started by the SuperLink for ``flwr run``):
it reads the run's spec from the file named by the run config's ``server-spec-file`` and
drives the same :class:`~fedmedbench.fl.engine.federation.Federation` round logic as a simulation,
over :class:`~fedmedbench.fl.engine.flower.FlowerTransport` with a per-round reply timeout (a site
that dies mid-round fails the round with a clear error; it never shrinks the average).

``client_app`` runs at each site under its SuperNode. Everything that touches the site's
data comes from the SuperNode's own ``--node-config`` (``partition-id``, ``data-dir``,
optional ``state-dir`` and ``device``), never from the server: the spec the server sends in
its first message carries the method, model and hyper-parameters only, and a site refuses a
run whose spec or run config asks for a data path or any key it does not know. The model is
built from the site's own copies of its files (``model/`` of its folder), which must have the
hashes the server sends. The site's data, whatever the task, is installed for its partition id
while a message is handled (:mod:`fedmedbench.deploy.site_data`), and a personalized method's
evaluation scores the site's own model on the site's own test data.
Messages carry arrays and metric/config records only (no pickles).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedmedbench import compat
from fedmedbench.deploy.deployable import why_not as why_not_deployable
from fedmedbench.deploy.site_data import (
    MODEL_FILES,
    PATH_FIELDS,
    get_field,
    load_site,
    read_manifest,
    set_field,
)
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.workflow import io

#: run-config keys of the app: the server's own settings (a site reads none of them)
SERVER_RUN_CONFIG = ("server-spec-file", "round-timeout-s")
#: the node-config keys a site may set
NODE_CONFIG = ("partition-id", "data-dir", "state-dir", "device")
STATE_KEY = "fedmedbench"
#: what "no file" looks like in a spec field
_EMPTY = ("", None, {})


class SiteRefusal(PermissionError):
    """The server's run asks a site for something the site decides itself."""


# ----------------------------------------------------------------------------- what the server sends


def client_spec_json(spec: RunSpec) -> str:
    """The spec without anything that names a file (:data:`PATH_FIELDS` blanked): what every site receives."""
    d = spec.to_dict()
    for field in PATH_FIELDS:
        value = get_field(d, field)
        set_field(d, field, {} if isinstance(value, dict) else ("" if field in ("run_dir", "partition_path") else None))
    return json.dumps(d, sort_keys=True, default=str)


def check_run_config(run_config: dict[str, Any]) -> None:
    unknown = sorted(set(run_config) - set(SERVER_RUN_CONFIG))
    if unknown:
        raise SiteRefusal(f"the run config sets {unknown}, which this site does not accept "
                          f"(allowed: {list(SERVER_RUN_CONFIG)}, all server-side)")


def default_state_dir(data_dir: Path) -> Path:
    """Beside the data folder, never inside it (a site folder holds exactly what its manifest lists)."""
    return data_dir.parent / f"{data_dir.name}-state"


def model_file_hashes(spec: RunSpec) -> dict[str, str]:
    """SHA-256 of each file the server's model is built from (by spec field): a site must hold the same."""
    d = spec.to_dict()
    return {f: io.file_digest(get_field(d, f), "sha256") for f in MODEL_FILES if get_field(d, f)}


def site_spec(spec_json: str, node_config: dict[str, Any], model_files: dict[str, str] | None = None) -> RunSpec:
    """The run's spec as this site runs it: the server's settings plus the site's own paths.

    ``model_files``: field -> SHA-256 of the files the server builds the model from; the site builds
    it from its own copies (``model/`` of its folder), which must have the same hashes."""
    d = json.loads(spec_json)
    unknown = sorted(set(d) - set(RunSpec.__dataclass_fields__))
    if unknown:
        raise SiteRefusal(f"the server's spec has unknown field(s) {unknown}")
    for field in PATH_FIELDS:
        if get_field(d, field) not in _EMPTY:
            raise SiteRefusal(f"the server's spec sets '{field}' = {get_field(d, field)!r}; a site's files come from its "
                              f"own node config (data-dir, state-dir), never from the server")
    extra = sorted(set(node_config) - set(NODE_CONFIG))
    if extra:
        raise SiteRefusal(f"unknown node-config key(s) {extra}; allowed: {list(NODE_CONFIG)}")
    missing = [k for k in ("partition-id", "data-dir") if k not in node_config]
    if missing:
        raise SiteRefusal(f"this SuperNode's --node-config lacks {missing} (e.g. \"partition-id=0 data-dir='/site/data'\")")
    data_dir = Path(str(node_config["data-dir"]))
    manifest = read_manifest(data_dir)
    # SERQ (FedST) runs on the server; its constructor only checks that the synthetic clips are named
    set_field(d, "method_params.serq.clips_root", str(data_dir))
    why = why_not_deployable(d, get_method(d["method"], d.get("method_params", {})).centralized)
    if why:  # refused when the run was exported too (rules/deploy.smk): a spec edited since is refused here
        raise SiteRefusal(why)
    for key in ("in_channels", "num_classes"):
        if d.get(key) is not None and manifest.get(key) is not None and int(d[key]) != int(manifest[key]):
            raise SiteRefusal(f"the server's model expects {key}={d[key]}, this site's data has {manifest[key]}")
    held = manifest.get("model_files") or {}
    for field, digest in (model_files or {}).items():  # the model is built from the site's own copies of its files
        if field not in MODEL_FILES:
            raise SiteRefusal(f"the server names a model file for '{field}', which is not a model-file field")
        name = held.get(field)
        if not name or manifest["files"].get(name, {}).get("sha256") != digest:
            raise SiteRefusal(f"the server's model is built from a '{field}' file with SHA-256 {digest}; this site's "
                              f"folder {data_dir} holds {name or 'none'} with another (export the site folder again)")
        set_field(d, field, str(data_dir / name))
    d["run_dir"] = str(node_config.get("state-dir") or default_state_dir(data_dir))
    if node_config.get("device"):
        d["device"] = str(node_config["device"])
    return RunSpec.from_dict(d)


# ----------------------------------------------------------------------------- site side

client_app = ClientApp()


def _site_spec(context: Context) -> RunSpec:
    if STATE_KEY not in context.state.config_records:
        raise RuntimeError("no run spec received yet: the server's first message sets it")
    rec = context.state.config_records[STATE_KEY]
    return site_spec(str(rec["spec"]), dict(context.node_config), json.loads(str(rec["model-files"])))


@contextlib.contextmanager
def _site_data_installed(context: Context, spec: RunSpec) -> Iterator[None]:
    """The site's own data stands in for the partition's while this message is handled, and only then
    (a process that handles other runs, or a simulation, never sees it)."""
    pid = int(context.node_config["partition-id"])
    folder = Path(str(context.node_config["data-dir"]))
    key = (str(folder.resolve()), pid, spec.to_json())
    if key not in _loaded:
        if len(_loaded) >= MAX_LOADED:
            _loaded.clear()
        _loaded[key] = load_site(folder, pid, spec)
    fed.site_data[pid] = _loaded[key]
    try:
        yield
    finally:
        fed.site_data.pop(pid, None)


#: sites' data kept loaded in this process (a SuperNode serves one site; an in-process test, a few)
MAX_LOADED = 4
_loaded: dict[tuple[str, int, str], Any] = {}


def _use_threads(spec: RunSpec) -> None:
    """The run's torch threads, in a site's process as in the simulation's: a different count can change
    the order of float reductions, so a result is bit-identical to the simulation's only with the same."""
    fed.client_threads = max(1, int(spec.threads))
    torch.set_num_threads(fed.client_threads)


def _delegate(msg: Message, context: Context) -> Message:
    check_run_config(dict(context.run_config))
    spec = _site_spec(context)
    _use_threads(spec)
    with _site_data_installed(context, spec):
        return engine.make_client_app(spec)(msg, context)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    """The server's first message: its spec (validated and kept for the run), answered with our partition id."""
    check_run_config(dict(context.run_config))
    spec_json = str(msg.content["spec"]["json"])
    model_files = str(msg.content["spec"].get("model-files", "{}"))
    spec = site_spec(spec_json, dict(context.node_config), json.loads(model_files))
    _use_threads(spec)
    context.state[STATE_KEY] = ConfigRecord({"spec": spec_json, "model-files": model_files})
    with _site_data_installed(context, spec):
        return engine.make_client_app(spec)(msg, context)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    return _delegate(msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _delegate(msg, context)


# ----------------------------------------------------------------------------- server side

server_app = ServerApp()


def run_server(grid: Grid, spec: RunSpec, round_timeout_s: float, log=print) -> None:
    """Run (or resume, from ``spec.run_dir``'s checkpoint) one federation over the grid's sites."""
    spec = fed.resolve_data_shapes(spec)
    _use_threads(spec)  # the server's own computations (aggregation, SERQ, evaluation) as in the simulation's process
    federation = fed.Federation(spec, log)
    model = fed.new_model(spec)
    allowed = engine.AllowedContent(federation.method.shared_keys(model), federation.method.extra_records)
    hello = RecordDict({"spec": ConfigRecord({"json": client_spec_json(spec),
                                              "model-files": json.dumps(model_file_hashes(spec))})})
    transport = engine.FlowerTransport(grid, federation.num_nodes, allowed, hello=hello, timeout=round_timeout_s)
    state = federation.run(transport)
    federation.stage_outputs(state)
    log(f"deployment finished: outputs in {spec.run_dir}")


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    compat.retry_grid_server_errors(grid)  # the SuperLink's 500 answers taken again, as a SuperNode does
    spec_file = str(context.run_config.get("server-spec-file", ""))
    if not spec_file:
        raise ValueError("run config 'server-spec-file' is empty: pass --run-config \"server-spec-file='<spec.json>'\"")
    path = Path(spec_file)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: server spec file not found (run config 'server-spec-file')")
    run_server(grid, RunSpec.from_json(path.read_text()), float(context.run_config.get("round-timeout-s", 600)))
