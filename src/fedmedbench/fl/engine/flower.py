"""The only module that talks to Flower: one training job = one Flower simulation.

A ServerApp (Message API) drives :class:`~fedmedbench.fl.engine.federation.Federation`
round by round; a ClientApp runs :func:`~fedmedbench.fl.engine.federation.client_train`
and :func:`~fedmedbench.fl.engine.federation.client_evaluate`. Everything that is not
message passing lives in ``federation``, so moving from ``run_simulation`` to its
successor (``flwr run``) changes this file only.

Flower facts this module handles (flwr 1.41, 1.42):

* ``run_simulation`` swallows ClientApp exceptions into error replies and would
  carry on with missing results: every reply is checked, and an error fails the
  job with the client's traceback (:class:`ClientFailure`).
* The ServerApp can start before all SuperNodes registered: we wait for all nodes.
* Node ids are random: we ask every node its ``partition-id`` once (a QUERY
  message) and address clients by partition id; sampling is seeded by round.
* Two backends run the same ServerApp and ClientApp. ``inline`` (default): an
  in-process :class:`InlineGrid` hands each Message to the ClientApp directly,
  clients one after another with all the job's threads — no Ray start-up (~9 s per
  job) and no polling floor (~0.2 s per round). ``ray``: Flower's ``run_simulation``
  with one Ray actor per thread of the job (parallel clients, GPU fractions), its temp
  dir under a per-job folder (removed afterwards), telemetry off (``compat``). Ray has no
  authentication: it is started on the loopback address (:data:`RAY_HOST`, dashboard off),
  so no Ray port listens beyond this machine.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SType
from flwr.serverapp import Grid, ServerApp

from fedmedbench.fl.api.method import Arrays, ClientResult
from fedmedbench.fl.api.method_errors import last_line, notes
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine.inline_grid import InlineGrid
from fedmedbench.fl.engine.job import Job, job_for
from fedmedbench.fl.engine.replies import examples_value
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state import checkpoint, scratch

NODE_WAIT_S = 180.0


class ClientFailure(RuntimeError):
    """A ClientApp raised; the message carries the client's traceback."""


class HeldArray(Array):
    """A Flower ``Array`` that keeps its tensor for a receiver in the same process.

    The inline backend hands Message objects to the ClientApp directly, so serialising every
    array (``np.save``) only for the receiver to parse it back (``np.load``) is pure cost. A held
    tensor is handed over as it is (on the job's device where the job keeps its arrays there):
    receivers only read it (loading it into a model copies it), and the sender never changes it
    after sending. Its bytes are made only if something serialises the message
    (``InlineGrid(wire=True)``, Flower's protobuf).
    """

    def __init__(self, value: torch.Tensor) -> None:  # noqa: D107 - Array's fields set from the value
        self.__dict__["_held"] = value
        self.dtype, self.shape, self.stype = _numpy_dtype_name(value.dtype), tuple(value.shape), SType.NUMPY

    @property
    def data(self) -> bytes:
        if "_data" not in self.__dict__:
            buffer = BytesIO()
            np.save(buffer, _host(self.__dict__["_held"]), allow_pickle=False)
            self.__dict__["_data"] = buffer.getvalue()
        return self.__dict__["_data"]

    @data.setter
    def data(self, value: bytes) -> None:
        self.__dict__["_data"] = value
        self.__dict__.pop("_held", None)

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the array (as ``np.load`` of its bytes would give)."""
        held = self.__dict__.get("_held")
        return super().numpy() if held is None else held.detach().to("cpu", copy=True).numpy()

    def value(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """What the receiver gets: the held tensor itself, or (after serialisation) the array on ``device``."""
        held = self.__dict__.get("_held")
        return held if held is not None else _tensor(super().numpy(), device)


@functools.cache
def _numpy_dtype_name(dtype: torch.dtype) -> str:
    """The NumPy name of a torch dtype (as ``np.save`` of the tensor's host copy would record it)."""
    return str(torch.empty(0, dtype=dtype).numpy().dtype)


def _host(value: torch.Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array on the host (a view of a CPU tensor's memory: for serialising)."""
    return value.detach().cpu().numpy()


def _tensor(value: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """A received NumPy array as a tensor on ``device`` (the receiver's job keeps its arrays there)."""
    return torch.from_numpy(value).to(device)


def _to_record(arrays: Arrays, held: bool = False) -> ArrayRecord:
    """Arrays as a Flower record: serialised (``np.save``), or held in memory for an in-process receiver."""
    rec = ArrayRecord()
    for key, value in arrays.items():
        rec[key] = HeldArray(value) if held else Array.from_numpy_ndarray(_host(value))
    return rec


def _from_record(rec: ArrayRecord, device: torch.device | str = "cpu") -> Arrays:
    """A record's arrays as tensors: held ones as they are, serialised ones on ``device``."""
    return {key: arr.value(device) if isinstance(arr, HeldArray) else _tensor(arr.numpy(), device)
            for key, arr in rec.items()}


def _metrics_record(metrics: dict[str, float]) -> MetricRecord:
    return MetricRecord({k: float(v) for k, v in metrics.items()})


# ----------------------------------------------------------------------------- client app


def make_client_app(spec: RunSpec, job: Job | None = None) -> ClientApp:
    """The ClientApp of a run. In-process backends hand it the server's resolved :class:`Job`;
    elsewhere (a Ray actor) the job is resolved once per process on first use."""
    app = ClientApp()

    held = job is not None  # in the server's process: replies hold their arrays (no serialisation)

    def _job() -> Job:
        return job if job is not None else job_for(spec)

    def _guard(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
        def wrapped(msg: Message, context: Context) -> Message:
            try:
                return handler(msg, context)
            except Exception as exc:  # noqa: BLE001 - re-raised with the full traceback as text
                pid = context.node_config.get("partition-id", "?")
                where = "".join(f" [{n}]" for n in notes(exc))  # the method's file:line
                raise RuntimeError(f"client {pid}: {last_line(exc)}{where}\n"
                                   f"{traceback.format_exc()}") from exc

        return wrapped

    @app.query()
    @_guard
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"info": ConfigRecord({"partition-id": pid})}), reply_to=msg)

    @app.train()
    @_guard
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        cfg, where = msg.content["config"], _job().array_device
        broadcast = {k[len("bcast."):]: _from_record(v, where) for k, v in msg.content.array_records.items()
                     if k.startswith("bcast.")}
        result = fed.client_train(_job(), pid, int(cfg["round"]), _from_record(msg.content["arrays"], where),
                                  int(cfg["steps"]), broadcast)
        content = RecordDict({
            "arrays": _to_record(result.arrays, held),
            "metrics": _metrics_record({**result.metrics, "num-examples": result.num_examples}),
        })
        for name, arrays in result.extras.items():
            content[f"extra.{name}"] = _to_record(arrays, held)
        return Message(content, reply_to=msg)

    @app.evaluate()
    @_guard
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        cfg = msg.content["config"]
        metrics = fed.client_evaluate(_job(), pid, int(cfg["round"]), _from_record(msg.content["arrays"], _job().array_device))
        return Message(RecordDict({"metrics": _metrics_record(metrics)}), reply_to=msg)

    return app


# ----------------------------------------------------------------------------- server app


#: the first line of a client's error as the ClientApp wrote it (``client <pid>: <error> [<where>]``)
_CLIENT_LINE = re.compile(r"client [^\s:]+: [^\n]*")
#: how Flower wraps an exception's text in an error reply: ``<class 'X'>:<'text'>``
_WRAPPED = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'\s*(.*?)(?:'>)?$", re.S)


def first_error_line(reason: str) -> str:
    """The line of an error reply's reason that says what failed: the client's line where the ClientApp wrote
    one (its error and the method's file:line), else the wrapped exception's first line."""
    found = _CLIENT_LINE.search(reason)
    if found:
        return found.group(0).removesuffix("'>").rstrip()
    wrapped = _WRAPPED.match(reason.strip())
    text = f"{wrapped.group(1)}: {wrapped.group(2)}" if wrapped else reason.strip()
    return text.splitlines()[0].removesuffix("'>") if text else "(no reason given)"


def _check_replies(replies: list[Message], expected: int, what: str) -> None:
    errors = [r for r in replies if r.has_error()]
    if errors:
        reason = errors[0].error.reason
        raise ClientFailure(f"{what}: {len(errors)} client(s) failed; first error: {first_error_line(reason)}\n"
                            f"{reason}")
    if len(replies) != expected:
        raise ClientFailure(f"{what}: expected {expected} replies, got {len(replies)}")


def _wait_for_nodes(grid: Grid, n: int) -> list[int]:
    deadline = time.monotonic() + NODE_WAIT_S
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} of {n} Flower nodes registered within {NODE_WAIT_S:.0f}s")
        time.sleep(0.05)


def _partition_map(grid: Grid, nodes: list[int], hello: RecordDict | None = None) -> dict[int, int]:
    """partition id -> node id, asked from the nodes themselves (``hello``: what the first message carries)."""
    msgs = [Message(hello if hello is not None else RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
            for n in nodes]
    replies = list(grid.send_and_receive(msgs))
    _check_replies(replies, len(nodes), "node discovery")
    return {int(r.content["info"]["partition-id"]): r.metadata.src_node_id for r in replies}


class AllowedContent:
    """What a client may send: model arrays of the shared keys, metrics, the method's declared extras."""

    def __init__(self, shared_keys: list[str], extra_records: tuple[str, ...]) -> None:
        self.shared_keys = set(shared_keys)
        self.records = {"arrays", "metrics"} | {f"extra.{n}" for n in extra_records}

    def check(self, content: RecordDict, pid: int | str) -> None:
        names = set(content.array_records) | set(content.metric_records) | set(content.config_records)
        unexpected = names - self.records
        if unexpected:
            raise ClientFailure(f"client {pid} sent undeclared record(s) {sorted(unexpected)}")
        if "arrays" not in content.array_records or "num-examples" not in content.metric_records.get("metrics", {}):
            raise ClientFailure(f"client {pid} sent a reply without its 'arrays' record or its 'num-examples' metric")
        if "arrays" in content.array_records:
            extra_keys = set(content["arrays"].keys()) - self.shared_keys
            if extra_keys:
                raise ClientFailure(f"client {pid} sent model entries outside the shared model: {sorted(extra_keys)[:5]}")


class FlowerTransport:
    """Federation <-> clients over Flower messages (one QUERY to map partition ids to nodes).

    ``timeout``: seconds to wait for a batch of replies (None: forever, as in simulation); a
    reply missing after it fails the round, it never makes a smaller average. ``device``: where
    the server keeps its arrays (received serialised arrays go there).
    """

    def __init__(self, grid: Grid, num_nodes: int, allowed: AllowedContent | None = None,
                 hello: RecordDict | None = None, timeout: float | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.grid = grid
        self.device = device
        self.allowed = allowed
        self.timeout = timeout
        self.node_of = _partition_map(grid, _wait_for_nodes(grid, num_nodes), hello)
        self.sequential = isinstance(grid, InlineGrid)
        self.held = self.sequential  # the inline grid delivers Message objects: arrays need no serialisation
        self.pid_of = {v: k for k, v in self.node_of.items()}

    def train(self, rnd, steps, arrays, broadcast):
        rec = _to_record(arrays, self.held)
        bcast = {f"bcast.{name}": _to_record(a, self.held) for name, a in broadcast.items()}
        msgs = [
            Message(RecordDict({"arrays": rec, "config": ConfigRecord({"round": rnd, "steps": k}), **bcast}),
                    dst_node_id=self.node_of[p], message_type=MessageType.TRAIN, group_id=str(rnd))
            for p, k in steps.items()
        ]
        # the inline grid runs clients one after another anyway: send one message at a time and decode
        # each reply at once, so the server never holds every client's serialised reply together
        batches = [[m] for m in msgs] if self.sequential else [msgs]
        results = {}
        for batch in batches:
            replies = list(self.grid.send_and_receive(batch, timeout=self.timeout))
            _check_replies(replies, len(batch), f"round {rnd} training")
            for r in replies:
                self.inspect(r)
                metrics = dict(r.content["metrics"])
                n = examples_value(metrics.pop("num-examples"))  # checked with the arrays (Federation)
                extras = {k[len("extra."):]: _from_record(v, self.device) for k, v in r.content.array_records.items()
                          if k.startswith("extra.")}
                results[self.pid_of[r.metadata.src_node_id]] = ClientResult(_from_record(r.content["arrays"], self.device),
                                                                            n, metrics, extras)
        return results

    def inspect(self, reply: Message) -> None:
        """Every training reply is checked against what the method may send (nothing else leaves a client)."""
        if self.allowed is not None:
            self.allowed.check(reply.content, self.pid_of.get(reply.metadata.src_node_id, "?"))

    def evaluate(self, rnd, pids, arrays):
        rec = _to_record(arrays, self.held)
        msgs = [Message(RecordDict({"arrays": rec, "config": ConfigRecord({"round": rnd})}),
                        dst_node_id=self.node_of[p], message_type=MessageType.EVALUATE, group_id=f"eval{rnd}")
                for p in pids]
        replies = list(self.grid.send_and_receive(msgs, timeout=self.timeout))
        _check_replies(replies, len(msgs), f"round {rnd} evaluation")
        return {self.pid_of[r.metadata.src_node_id]: dict(r.content["metrics"]) for r in replies}


BACKENDS = ("inline", "ray")
#: the only address Ray's processes (GCS, raylet, object manager, actors) listen on
RAY_HOST = "127.0.0.1"


def run(spec: RunSpec, log: Callable[[str], None] = print, pool: fed.SharedRounds | None = None) -> fed.Federation:
    """Run (or resume) one federated job to completion and write its outputs (``pool``: side by side with other
    runs, their rounds' clients trained in one call: ``fl/engine/runs_together.py``)."""
    if spec.backend not in BACKENDS:
        raise ValueError(f"engine.backend = {spec.backend!r}: choose one of {list(BACKENDS)}")
    spec = fed.resolve_data_shapes(spec)
    checkpoint.prepare(spec.run_dir, spec.resume)  # temp files of a killed job; resume=restart drops the checkpoint
    federation = fed.Federation(spec, log)
    federation.final_state = None
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        allowed = AllowedContent(federation.job.shared_keys(), federation.method.extra_records)
        transport = FlowerTransport(grid, federation.num_nodes, allowed, device=federation.job.array_device)
        federation.final_state = federation.run(fed.with_clients_together(transport, federation.job, log, pool))

    if spec.backend == "inline":
        _run_inline(spec, federation, server_app, log)
    else:
        _run_ray(spec, federation, server_app, log)
    if federation.final_state is None:
        raise RuntimeError("the Flower run ended without completing the run (see the log above)")
    federation.stage_outputs(federation.final_state)
    return federation


def complete(spec: RunSpec, log: Callable[[str], None] = print) -> None:
    """Call once every output of the job is written: removes the run's resume state (server
    checkpoint, client states) and its working files (``work/``: staged data views, external
    trainers' folders) unless ``keep_checkpoints`` is set."""
    freed = checkpoint.release(spec.run_dir, keep=spec.keep_checkpoints)
    if freed:
        log(f"run complete: removed its resume state {checkpoint.checkpoint_dir(spec.run_dir)} ({freed / 2**20:.1f} MiB; "
            "keep_checkpoints: true keeps it)")
    size, entries, failed = scratch.release(spec.run_dir, keep=spec.keep_checkpoints)
    if entries:
        log(f"run complete: removed its working files {scratch.scratch_dir(spec.run_dir)} ({entries} entries, "
            f"{size / 2**20:.1f} MiB on disk; keep_checkpoints: true keeps them)")
    for line in failed:
        log(f"run complete: could not remove {line}")


def job_name(spec: RunSpec) -> str:
    return f"job {spec.study}/{spec.dataset}/{spec.setting}/{spec.method}/seed{spec.seed}"


def _run_inline(spec: RunSpec, federation: fed.Federation, server_app: ServerApp, log: Callable[[str], None]) -> None:
    threads = max(1, int(spec.threads))
    log(f"{job_name(spec)}: {federation.num_nodes} Flower node(s) in-process (inline backend), "
        f"{threads} thread(s), device {federation.device}")
    fed.client_threads = threads
    federation.job.state_store.deferred = True  # the round's checkpoint writes what its clients saved
    if federation.job.place_arrays(in_process=True):
        log(f"{job_name(spec)}: model arrays stay on {federation.device} between server and clients")
    grid = InlineGrid(make_client_app(spec, federation.job), federation.num_nodes, seed=spec.seed)
    grid.serve(server_app)


def _run_ray(spec: RunSpec, federation: fed.Federation, server_app: ServerApp, log: Callable[[str], None]) -> None:
    from flwr.simulation import run_simulation

    threads = max(1, int(spec.threads))
    use_gpu = federation.device.type == "cuda"
    actors = min(threads, federation.num_nodes)
    tmp_root = Path(os.environ.get("FEDMEDBENCH_RAY_TMP", "/tmp"))
    remove_orphaned_ray_dirs(tmp_root)
    ray_tmp = Path(tempfile.mkdtemp(prefix=f"fmb-ray-{os.getpid()}-", dir=tmp_root))
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": (1.0 / actors) if use_gpu else 0.0},
        "init_args": ray_init_args(actors, use_gpu, ray_tmp),
    }
    log(f"{job_name(spec)}: {federation.num_nodes} Flower node(s), {actors} Ray actor(s), device {federation.device}")
    try:
        run_simulation(server_app=server_app, client_app=make_client_app(spec), num_supernodes=federation.num_nodes,
                       backend_config=backend_config)
    finally:
        _shutdown_ray()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def ray_init_args(actors: int, use_gpu: bool, temp_dir: Path) -> dict:
    """``ray.init``'s arguments for one job: on the loopback address only (Ray has no authentication), no dashboard."""
    from fedmedbench.compat import keep_ray_on_loopback

    keep_ray_on_loopback()
    return {"num_cpus": actors, "num_gpus": 1 if use_gpu else 0, "_temp_dir": str(temp_dir), "_node_ip_address": RAY_HOST,
            "include_dashboard": False, "logging_level": 40, "log_to_driver": True}


def remove_orphaned_ray_dirs(root: Path) -> list[Path]:
    """Delete Ray temp dirs left by killed jobs (``fmb-ray-<pid>-*`` whose process is gone)."""
    removed = []
    for d in root.glob("fmb-ray-*-*"):
        pid = d.name.split("-")[2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _shutdown_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - best effort cleanup
        pass
