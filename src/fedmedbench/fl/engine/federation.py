"""The round logic of a federated run, independent of the transport (Flower).

Server side (:class:`Federation`): initial model, seeded client sampling by
partition id, step budgets, aggregation through the method, evaluation, metric rows,
checkpoint/resume, progress lines. Client side (:func:`client_train`,
:func:`client_evaluate`): what a ClientApp does with a message, using the method's
client step and the client-state store. Both sides use the run's :class:`~fedmedbench.fl.engine.job.Job`
(method, task, device and the reused model, resolved once). ``engine`` moves messages between the two.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fedmedbench.fl.api.arrays import host_copies, host_tensors, model_arrays
from fedmedbench.fl.api.method import Arrays, ClientContext, ClientResult, ServerContext
from fedmedbench.fl.api.method_errors import note_method
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.determinism import seeded_generator
from fedmedbench.fl.engine import replies
from fedmedbench.fl.engine.job import Job, resolve_device  # noqa: F401  (resolve_device: imported from here elsewhere)
from fedmedbench.fl.spec import RunSpec, result_params
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.state.client_state import ClientStateStore
from fedmedbench.fl.stopping import DataFreeMonitor
from fedmedbench.fl.tasks.base import get_task_class, task_for  # noqa: F401  (task_for: imported from here elsewhere)
from fedmedbench.fl.tracking import for_run as tracker_for_run
from fedmedbench.fl.training import steps_for_epochs
from fedmedbench.partition import replay as partition_replay
from fedmedbench.workflow.io import read_json


def resolve_data_shapes(spec: RunSpec) -> RunSpec:
    """Fill in what the task reads from the data (input channels, class count), not config."""
    return get_task_class(spec.task).resolve_spec(spec)


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def init_note(spec: RunSpec) -> str:
    """How the run's model started, for table captions: the weight sets it loaded, or random init."""
    if spec.weights_sha256:
        return "pretrained " + " + ".join(sorted(spec.weights_sha256))
    if spec.pretrained_path and spec.task in ("classification", "detection"):
        return f"pretrained {Path(spec.pretrained_path).name}"
    return "random init"


def new_model(spec: RunSpec) -> torch.nn.Module:
    return get_method(spec.method, spec.method_params, spec.method_file).build_model(spec)


def client_generator(seed: int, rnd: int, pid: int) -> torch.Generator:
    return seeded_generator(seed, rnd, pid)


#: the third key of a client's dropout generator (a model with ``set_dropout_generator``, e.g. ``swin_gpaf``)
DROPOUT_STREAM = 0xD809


#: per-epoch training losses a client reports: train_loss_e1, train_loss_e2, ... (local epoch e)
EPOCH_LOSS = re.compile(r"train_loss_e(\d+)")
#: prefix of the client-side validation metrics (``RunSpec.client_validation``)
CLIENT_VAL = "client_val_"


def _nanmean(values: list[float]) -> float:
    arr = np.asarray(values, dtype=float)
    return float(np.nanmean(arr)) if np.isfinite(arr).any() else math.nan


# ----------------------------------------------------------------------------- client side


#: torch threads a client step uses: 1 in a Ray actor (one CPU each); the inline backend
#: runs clients one after another in the job's process and sets the job's threads
client_threads = 1


#: a deployed site's own data (partition id -> fedmedbench.deploy.site_data.Site: ``data`` and
#: ``evaluate``, read from its folder); empty in simulation, where the task serves every client
site_data: dict[int, Any] = {}


def _client_context(
    job: Job, pid: int, rnd: int, arrays: Arrays, steps: int, broadcast: dict[str, Arrays] | None = None,
    model: torch.nn.Module | None = None,
) -> tuple[ClientContext, ClientStateStore]:
    """A client's context for round ``rnd``; ``model``: the model holding ``arrays`` when already built."""
    torch.set_num_threads(client_threads)
    store = job.state_store
    # the centralized client's "local epoch" is one epoch's share of its round budget (the federation's
    # steps of one local epoch), so its per-epoch losses line up with the federated methods' epochs
    epochs = max(1, math.ceil(job.train.local_epochs))
    ctx = ClientContext(
        pid=pid, rnd=rnd, model=job.model_with(arrays) if model is None else model, data=site_data[pid].data if pid in site_data else job.client_data(pid),
        train=job.train, device=job.device, generator=client_generator(job.spec.seed, rnd, pid),
        state=store.load(pid, before_round=rnd), steps=steps, global_arrays=arrays, broadcast=broadcast or {},
        # a deployed site knows no other site's size (methods that need them say so)
        client_sizes=None if pid in site_data else (lambda: job.task.client_sizes()),
        epoch_steps=max(1, math.ceil(steps / epochs)) if job.method.centralized else None,
        array_device=job.array_device, slots=job.slots,
    )
    if hasattr(ctx.model, "set_dropout_generator"):  # dropout masks from (seed, round, client), not the global stream
        ctx.model.set_dropout_generator(seeded_generator(job.spec.seed, rnd, pid, DROPOUT_STREAM))
    return ctx, store


def client_train(
    job: Job, pid: int, rnd: int, arrays: Arrays, steps: int, broadcast: dict[str, Arrays] | None = None
) -> ClientResult:
    """One client's work in one round (called inside the ClientApp)."""
    ctx, store = _client_context(job, pid, rnd, arrays, steps, broadcast)
    try:
        result = job.method.client_fit(ctx)
    except Exception as exc:
        note_method(exc, job.method, f"the client step of round {rnd}")
        raise
    if job.spec.client_validation:
        result.metrics.update(client_validation(job, ctx))
    undeclared = set(result.extras) - set(job.method.extra_records)
    if undeclared:
        raise RuntimeError(f"method '{job.spec.method}' tried to send undeclared records {sorted(undeclared)}")
    store.save(pid, rnd, ctx.state)
    return result


def clients_train_together(job: Job, steps: dict[int, int], rnd: int, arrays: Arrays,
                           broadcast: dict[str, Arrays] | None = None,
                           pool: SharedRounds | None = None,
                           note: Callable[[str], None] | None = None) -> dict[int, ClientResult]:
    """The clients of ``steps`` (partition id -> steps) trained together (``train.batch_clients``:
    ``Method.fit_together``), or one by one where this round's clients cannot be. ``pool``: several runs side
    by side, whose rounds train in one batched call (``fl/engine/runs_together.py``); ``note``: the clients'
    ``ClientContext.note`` (where a round says why it trains one by one)."""
    model = job.model_with(arrays)
    pairs = [_client_context(job, pid, rnd, arrays, k, broadcast, model=model) for pid, k in steps.items()]
    for ctx, _ in pairs:
        ctx.note = note
    try:
        results = job.method.fit_together([ctx for ctx, _ in pairs], None if pool is None else pool.train)
    except Exception as exc:
        note_method(exc, job.method, f"the client step of round {rnd} (clients trained together)")
        raise
    if results is None:
        if pool is not None:
            pool.train([ctx for ctx, _ in pairs], None)  # this round trains one by one: the others go on without it
        return {pid: client_train(job, pid, rnd, arrays, k, broadcast) for pid, k in steps.items()}
    for ctx, store in pairs:
        store.save(ctx.pid, rnd, ctx.state)
    return {ctx.pid: r for (ctx, _), r in zip(pairs, results, strict=True)}


def why_not_together(job: Job) -> str | None:
    """Why this run's clients cannot be trained together (None: they can)."""
    spec = job.spec
    if job.method.centralized:
        return "a centralized run has one client"
    if spec.backend != "inline":
        return f"engine.backend is {spec.backend} (clients in other processes)"
    if spec.client_validation:
        return "client validation evaluates each client's own model"
    if spec.client_augmentation:
        return "client_augmentation reads each client's batches through its own loader (fl/augment.py)"
    return job.method.why_not_together(job.resident, job.train)


def client_validation(job: Job, ctx: ClientContext) -> dict[str, float]:
    """The client's own model right after its local training, on its own validation split
    (``client_val_<m>``, and ``client_val_examples`` for a weighted average; GPAF Fig. 5a)."""
    task = get_task_class(job.spec.task)  # the class: a deployed site builds no task (it has no partition)
    metrics = task.evaluate_validation(job.method.personal_model(ctx), ctx.data, ctx.device, job.train.eval_batch_size,
                                       generator=ctx.generator)
    return {**{f"{CLIENT_VAL}{k}": float(v) for k, v in metrics.items()},
            f"{CLIENT_VAL}examples": float(len(ctx.data.val_y))}


def client_evaluate(job: Job, pid: int, rnd: int, arrays: Arrays) -> dict[str, float]:
    """A personalized client's metrics: its own model on its local test split and the global test set."""
    ctx, _ = _client_context(job, pid, rnd + 1, arrays, steps=0)  # state as of the end of round rnd
    evaluate = site_data[pid].evaluate if pid in site_data else job.task.evaluate_client
    return evaluate(job.method.personal_model(ctx), ctx.data, ctx.device)


# ----------------------------------------------------------------------------- server side


class Transport(Protocol):
    """How the server reaches clients (Flower messages in ``engine``; direct calls in tests)."""

    def train(self, rnd: int, steps: dict[int, int], arrays: Arrays, broadcast: dict[str, Arrays]) -> dict[int, ClientResult]:
        """Train the clients in ``steps`` (partition id -> steps) from ``arrays``; results by partition id."""

    def evaluate(self, rnd: int, pids: list[int], arrays: Arrays) -> dict[int, dict[str, float]]:
        """Personalized evaluation metrics by partition id."""


class SharedRounds(Protocol):
    """Where several runs side by side hand in their rounds, trained in one call (``fl/runs_together.RoundPool``)."""

    def train(self, ctxs: list[ClientContext], hooks: list[Any] | None) -> list[tuple[Arrays, dict[str, float]]]:
        """This run's round trained with the others' (no hooks: this run is present, training one by one)."""

    def withdraw(self) -> None:
        """This run hands in no more rounds."""


class TogetherTransport:
    """Training of each round's clients together, in this process (``train.batch_clients``); evaluation
    through the transport it wraps."""

    def __init__(self, inner: Transport, job: Job, pool: SharedRounds | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.inner, self.job, self.pool, self.log = inner, job, pool, log
        self.said: set[str] = set()

    def note(self, line: str) -> None:
        """``line`` into the run's log, the first time it comes (a reason a round trains one by one recurs)."""
        if line not in self.said:
            self.said.add(line)
            self.log(line)

    def train(self, rnd, steps, arrays, broadcast):
        return clients_train_together(self.job, steps, rnd, arrays, broadcast, self.pool, self.note)

    def evaluate(self, rnd, pids, arrays):
        return self.inner.evaluate(rnd, pids, arrays)


def with_clients_together(transport: Transport, job: Job, log: Callable[[str], None] = print,
                          pool: SharedRounds | None = None) -> Transport:
    """``transport``, training its clients together where ``train.batch_clients`` asks and the run allows
    (else said once in the log); with ``pool``, in one call with the pool's other runs."""
    reason = why_not_together(job) if job.train.batch_clients else "train.batch_clients is off"
    if reason:
        if pool is not None:
            pool.withdraw()  # this run never hands in a round: the others do not wait for it
        if job.train.batch_clients:
            log(f"train.batch_clients: clients trained one by one ({reason})")
        return transport
    return TogetherTransport(transport, job, pool, log)


class InProcessTransport:
    """Calls the client functions directly, in this process (tests, debugging)."""

    def __init__(self, spec: RunSpec | Job) -> None:
        self.job = spec if isinstance(spec, Job) else Job(spec)

    def train(self, rnd, steps, arrays, broadcast):
        return {p: client_train(self.job, p, rnd, arrays, k, broadcast) for p, k in steps.items()}

    def evaluate(self, rnd, pids, arrays):
        return {p: client_evaluate(self.job, p, rnd, arrays) for p in pids}



def clients_without_holdout(partition_path: str | None) -> dict[str, list[int]]:
    """``clients_without_val_data`` / ``clients_without_test_data`` of a MedMNIST partition (none for other tasks)."""
    if not partition_path or not Path(partition_path).is_file() or Path(partition_path).suffix != ".json":
        return {}
    from fedmedbench.fl.data import load_partition
    from fedmedbench.partition.schemes import clients_without_holdout as empty_parts

    doc = load_partition(str(partition_path))
    if not all(isinstance(c, dict) and "val" in c and "test" in c for c in doc.get("clients", [])):
        return {}
    return {f"clients_without_{part}_data": ids for part, ids in empty_parts(doc).items()}


def unscored_clients(client_rows: list[dict], metric: str) -> list[int]:
    """Clients with no local score in the last evaluated round (no test data of their own): ``local_mean_*``
    averages the others, and summary.json names them."""
    if not client_rows:
        return []
    last = max(r["round"] for r in client_rows)
    def scored(value) -> bool:
        return isinstance(value, int | float) and math.isfinite(value)

    final = [r for r in client_rows if r["round"] == last]
    if not any(f"local_{metric}" in r for r in final):  # a task that scores no client locally
        return []
    return sorted(int(r["client"]) for r in final if not scored(r.get(f"local_{metric}")))

class Federation:
    """Server-side state and logic of one run."""

    def __init__(self, spec: RunSpec | Job, log: Callable[[str], None] = print) -> None:
        self.job = spec if isinstance(spec, Job) else Job(spec)  # method, task and device resolved once
        self.spec = spec = self.job.spec
        self.log = log
        self.method = self.job.method
        self.train = self.job.train
        self.device = self.job.device
        self.task = self.job.task
        self.run_hash = spec.run_hash()
        self.num_clients = self.task.num_clients
        self.num_nodes = 1 if self.method.centralized else self.num_clients
        sizes = self.task.client_sizes()
        #: training examples by partition id, as the replies must report them (the pooled client's: unknown)
        self.client_sizes = None if self.method.centralized else dict(enumerate(sizes))
        self._reference: torch.nn.Module | None = None  # the model replies are checked against, built once
        self._layout: dict[str, tuple[tuple[int, ...], str]] | None = None
        self.client_steps = [steps_for_epochs(n, self.train.local_epochs, self.train.batch_size) for n in sizes]
        per_round = spec.clients_per_round or self.num_clients
        if not 1 <= per_round <= self.num_clients:
            raise ValueError(f"clients_per_round={per_round} must be between 1 and num_clients={self.num_clients}")
        self.per_round = per_round
        # the early-stopping authors' per-round draws (partition/replay.py); None = the project's sampler
        self.reference_clients = partition_replay.client_sequence(
            spec.random_draws, spec.seed, self.num_clients, per_round,
            read_json(spec.partition_path) if spec.random_draws == "reference_cache_build" else None)
        self.keep_round = spec.client_models_round or self.train.rounds
        if spec.save_client_models and not 1 <= self.keep_round <= self.train.rounds:
            raise ValueError(f"client_models_round={self.keep_round} must be between 1 and train.rounds={self.train.rounds}")
        if spec.client_validation not in (None, "mean", "weighted"):  # before any client trains
            raise ValueError(f"client_validation = {spec.client_validation!r}: use mean, weighted or null")
        self.store = self.job.state_store
        self.rows_log = checkpoint.RowsLog(spec.run_dir)  # each checkpoint appends its round's rows
        self._writer: checkpoint.BackgroundWriter | None = None  # set while run() goes
        self._theta0_at: dict[torch.device, Arrays] = {}  # theta_0 as float64 tensors, made once per device
        es = {"mode": "none", "tau": 0.01, "patience": 10, **spec.early_stopping}
        if es["mode"] not in ("none", "datafree"):
            raise ValueError(f"early_stopping.mode must be none or datafree, got {es['mode']}")
        self.stop_mode = es["mode"]
        self.monitor = DataFreeMonitor(float(es["tau"]), int(es["patience"]), es.get("counting", "reference"))
        self._t0 = time.monotonic()
        self.tracker = tracker_for_run(spec, self.run_hash, self.train, log)  # metrics out; never changes results
        self.clock = RoundClock()  # the rounds' own durations, for s/round and the ETA

    # -- state ------------------------------------------------------------------
    def initial_state(self) -> checkpoint.RunState:
        resumed = checkpoint.load(self.spec.run_dir, self.run_hash, self.rows_log)
        if resumed is not None:
            self.store.discard_after(resumed.round)
            self.log(f"resuming from checkpoint at round {resumed.round}/{self.train.rounds}")
            self._t0 -= resumed.elapsed
            resumed.arrays = self.job.arrays(resumed.arrays)
            return resumed
        stale = checkpoint.checkpoint_dir(self.spec.run_dir)
        if stale.exists():
            if (stale / "server.pt").is_file():
                self.log(f"ignoring checkpoint in {stale}: written under other settings")
            else:  # a run stopped before its first round was checkpointed: nothing of it to resume
                self.log(f"no checkpoint in {stale} (the run stopped before its first round was saved): "
                         "starting at round 1")
            shutil.rmtree(stale)
        seed_everything(self.spec.seed)
        partition_replay.cache_build_torch_draws(self.spec.random_draws)  # the run that built the reference's cache
        model = self.job.new_model()
        arrays = model_arrays(model, self.method.shared_keys(model))
        params = [n for n, _ in model.named_parameters() if n in arrays]
        # theta_0 for the task vector of the data-free stopping rule (parameters only, not buffers)
        return checkpoint.RunState(round=0, arrays=self.job.arrays(arrays),
                                   server_state={"_theta0": host_copies({k: arrays[k] for k in params})})

    def sample(self, rnd: int) -> list[int]:
        """Partition ids trained in round ``rnd``: seeded by (seed, round), not by node ids."""
        if self.method.centralized:
            return [0]
        if self.per_round == self.num_clients:
            return list(range(self.num_clients))
        if self.reference_clients is not None:
            return sorted(self.reference_clients.clients(rnd))
        rng = np.random.default_rng([self.spec.seed, rnd, 1])
        return sorted(rng.choice(self.num_clients, size=self.per_round, replace=False).tolist())

    def steps(self, pid: int) -> int:
        if self.method.centralized:  # same expected steps per round as the federation
            return max(1, int(round(sum(self.client_steps) * self.per_round / self.num_clients)))
        return self.client_steps[pid]

    # -- one round ----------------------------------------------------------------
    def broadcast(self, state: checkpoint.RunState) -> dict[str, Arrays]:
        """The named array sets sent to clients with the global model (stored in server state), where the
        job keeps its arrays."""
        return {name: self.job.arrays(arrays) for name, arrays in state.server_state.get("_broadcast", {}).items()}

    def aggregate(self, state: checkpoint.RunState, rnd: int, results: dict[int, ClientResult]) -> Arrays:
        pids = sorted(results)
        ctx = ServerContext(
            rnd=rnd, global_arrays=state.arrays, results=[results[p] for p in pids], pids=pids,
            state=state.server_state, num_clients=self.num_clients, device=self.device, train=self.train,
            new_model=self.job.new_model, broadcast=self.broadcast(state), seed=self.spec.seed,
            loader_workers=self.spec.loader_workers, image_cache=self.spec.image_cache,
        )
        try:
            new_arrays = self.method.aggregate(ctx)
        except Exception as exc:
            note_method(exc, self.method, f"the server step (aggregate) of round {rnd}")
            raise
        state.server_state["_broadcast"] = {name: host_tensors(a) for name, a in ctx.broadcast.items()}
        return new_arrays

    def needs_client_eval(self, rnd: int) -> bool:
        return self.method.personalized and self._is_eval_round(rnd)

    def _is_eval_round(self, rnd: int) -> bool:
        return rnd % max(1, self.spec.eval_every) == 0 or rnd == self.train.rounds

    def _server_eval(self, arrays: Arrays, rnd: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        """The global model of round ``rnd``, evaluated by the task (global/validation rows and one row per client)."""
        self.task.set_eval_round(rnd)
        return self.task.evaluate_global(self.job.model_with(arrays), self.device)

    def finish_round(
        self,
        state: checkpoint.RunState,
        rnd: int,
        results: dict[int, ClientResult],
        new_arrays: Arrays,
        client_eval: dict[int, dict[str, float]] | None = None,
    ) -> checkpoint.RunState:
        """Evaluate, record metrics, checkpoint; returns the new state."""
        row: dict[str, Any] = {"round": rnd, "clients": len(results)}
        ordered = [results[p] for p in sorted(results)]  # partition order, whatever order replies came in
        n = np.array([r.num_examples for r in ordered], dtype=float)
        losses = np.array([r.metrics.get("train_loss", math.nan) for r in ordered])
        row["train_loss"] = float(np.average(losses, weights=n)) if len(n) else math.nan
        row.update(epoch_losses(ordered))
        if self.spec.client_validation:
            row.update(client_validation_row(ordered, self.task.metric_names, self.spec.client_validation))
        per_client: list[dict[str, float]] = []
        if self._is_eval_round(rnd):
            if self.method.personalized:
                per_client = [client_eval[p] for p in sorted(client_eval or {})]
                for k in self.task.metric_names:  # global numbers = mean over the clients' own models
                    row[f"global_{k}"] = _nanmean([c.get(f"global_{k}", math.nan) for c in per_client])
                    row[f"val_{k}"] = math.nan
            else:
                glob, per_client = self._server_eval(new_arrays, rnd)
                row.update(glob)
            for k in self.task.metric_names:
                vals = np.array([c.get(f"local_{k}", math.nan) for c in per_client], dtype=float)
                row[f"local_mean_{k}"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else math.nan
                row[f"local_std_{k}"] = float(np.nanstd(vals)) if np.isfinite(vals).any() else math.nan
        row.update(self.monitor.update(state.rows, DataFreeMonitor.task_norm(new_arrays, self._theta0(state, new_arrays))))
        elapsed = time.monotonic() - self._t0
        row["elapsed_s"] = round(elapsed, 3)
        client_rows = [{"round": rnd, "client": i, **{k: v for k, v in c.items() if not k.startswith(("global_", "val_"))}}
                       for i, c in enumerate(per_client)]
        new_state = checkpoint.RunState(
            round=rnd, arrays=new_arrays, server_state=state.server_state,
            rows=state.rows + [row], client_rows=state.client_rows + client_rows, elapsed=elapsed,
        )
        if self.spec.save_client_models and rnd == self.keep_round:
            self._save_final_client_models(results, new_arrays if rnd != self.train.rounds else None)
        # written while the next round trains; client states older than this checkpoint's go once it is on disk
        checkpoint.save(self.spec.run_dir, new_state, self.run_hash, self._writer, then=lambda: self.store.prune(rnd),
                        store=self.store, rows_log=self.rows_log)
        self.clock.stop()
        self._progress(row)
        self.tracker.round(row, client_rows, results)
        return new_state

    def _theta0(self, state: checkpoint.RunState, like: Arrays) -> Arrays:
        """theta_0 of the data-free rule where ``like`` (the new global arrays) is, in the rule's float64,
        made once per device, so a round converts only the new model."""
        stored = state.server_state["_theta0"]
        device = next(iter(like.values())).device if like else torch.device("cpu")
        if device not in self._theta0_at:
            self._theta0_at[device] = {k: v.to(device, torch.float64) for k, v in stored.items()}
        return self._theta0_at[device]

    def run(self, transport: Transport) -> checkpoint.RunState:
        """The round loop: sample, train (via the transport), aggregate, evaluate, checkpoint, stop.
        Every checkpoint is on disk when it returns (or raises)."""
        self._writer = checkpoint.BackgroundWriter()
        try:
            state = self._rounds(transport)
        except BaseException:
            self.store.stop_reading()
            self.tracker.close(ok=False)
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the round's own error is the one to report
                pass
            raise
        self.store.stop_reading()
        self._writer.close()
        self.tracker.close()
        return state

    def _rounds(self, transport: Transport) -> checkpoint.RunState:
        state = self.initial_state()
        rounds = self.train.rounds
        for rnd in range(state.round + 1, rounds + 1):
            if self.should_stop(state):  # resumed after the data-free rule had fired
                break
            self.clock.start()
            sampled = self.sample(rnd)
            self.store.prefetch(sampled, rnd)  # in-process: each client's state read while the one before trains
            results = transport.train(rnd, {p: self.steps(p) for p in sampled}, state.arrays, self.broadcast(state))
            if sorted(results) != sampled:
                raise RuntimeError(f"round {rnd}: results for clients {sorted(results)}, expected {sampled}")
            self.check_replies(rnd, results)
            new_arrays = self.aggregate(state, rnd, results)
            replies.check_aggregated(rnd, new_arrays, self.model_layout(), self.job.shared_keys(), self.spec.method)
            if self.train.on_nonfinite == "error":
                replies.check_global(rnd, new_arrays, results, self.spec.method)
            if not (self.spec.save_client_models and rnd == self.keep_round):  # aggregated: drop the clients' arrays
                results = {p: ClientResult({}, r.num_examples, r.metrics) for p, r in results.items()}
            client_eval = transport.evaluate(rnd, list(range(self.num_nodes)), new_arrays) if self.needs_client_eval(rnd) else None
            state = self.finish_round(state, rnd, results, new_arrays, client_eval)
            if self.should_stop(state):
                self.log(f"data-free early stop at round {rnd}/{rounds} ({rounds - rnd} rounds saved)")
                break
        return state

    def reference(self) -> torch.nn.Module:
        """A model of the run's architecture, built once: what replies and aggregated models are checked against."""
        if self._reference is None:
            with torch.random.fork_rng(devices=[]):  # a model built mid-run must not move the run's random draws
                self._reference = self.job.new_model()
        return self._reference

    def model_layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        if self._layout is None:
            self._layout = replies.model_layout(self.reference())
        return self._layout

    def check_replies(self, rnd: int, results: dict[int, ClientResult]) -> None:
        """Every client's reply against the server's model and what the method says it sends, before any is
        averaged (:mod:`~fedmedbench.fl.engine.replies`)."""
        check = replies.ReplyCheck(rnd, self.method.reply_keys(self.reference(), rnd, self.train),
                                   self.model_layout(), self.client_sizes,
                                   finite=self.train.on_nonfinite == "error")
        for pid in sorted(results):
            r = results[pid]
            check.check(pid, r.arrays, r.num_examples, r.extras)

    def should_stop(self, state: checkpoint.RunState) -> bool:
        """True when the data-free rule fired and the run is configured to stop on it."""
        return self.stop_mode == "datafree" and bool(state.rows and state.rows[-1].get("datafree_stop"))

    def _final_client_models_path(self) -> Path:
        return checkpoint.checkpoint_dir(self.spec.run_dir) / "final_client_models.pt"

    def _save_final_client_models(self, results: dict[int, ClientResult], global_arrays: Arrays | None = None) -> None:
        """Optional (``save_client_models``): what each client sent in the kept round (the last one, or
        ``client_models_round``), for analyses such as t-SNE of client features; before the last round
        that round's global arrays come with them (``"global"``). Written before the round's
        checkpoint, so a resumed run still has it."""
        from fedmedbench.workflow.io import write_torch

        payload = {str(pid): host_copies(r.arrays) for pid, r in sorted(results.items()) if r.arrays}
        if global_arrays is not None:
            payload["global"] = host_copies(global_arrays)
        write_torch(self._final_client_models_path(), payload, what="client models")

    def _progress(self, row: dict[str, Any]) -> None:
        """One line per round: in the log, and on the console when the log offers one (``log.console``)."""
        rnd, total = row["round"], self.train.rounds
        if rnd % max(1, self.spec.log_every) and rnd != total:
            return
        per_round = self.clock.per_round()
        self.log(progress_line(row, total, self.task.primary_metric, per_round))
        console = getattr(self.log, "console", None)
        if console is not None:
            console(console_line(self.spec, row, total, self.task.primary_metric, per_round))

    def stage_outputs(self, state: checkpoint.RunState) -> dict[str, Path]:
        """Write metrics CSV, per-client CSV, summary JSON and final model (atomically)."""
        import pandas as pd

        from fedmedbench.workflow import io

        run_dir = Path(self.spec.run_dir)
        metrics = pd.DataFrame(state.rows)
        io.write_csv(run_dir / "metrics.csv", metrics)
        io.write_csv(run_dir / "client_metrics.csv", pd.DataFrame(state.client_rows))
        io.write_torch(run_dir / "model.pt", host_copies(state.arrays), what="final model")  # reproducible bytes
        if self.spec.save_client_models:
            src = self._final_client_models_path()
            if not src.is_file():
                raise FileNotFoundError(f"{src}: the last round's client models are missing (save_client_models is on); "
                                        "delete the run's checkpoint/ to rerun it")
            with io.atomic_path(run_dir / "client_models.pt") as tmp:
                shutil.copyfile(src, tmp)
        last = state.rows[-1] if state.rows else {}
        summary = {
            "study": self.spec.study, "dataset": self.spec.dataset, "setting": self.spec.setting,
            "method": self.spec.method, "seed": self.spec.seed, "data_origin": self.spec.data_origin,
            "rounds": self.train.rounds, "rounds_run": state.round, "num_clients": self.num_clients,
            "early_stopping": self.stop_mode, "rounds_saved": self.train.rounds - state.round,
            "clients_per_round": self.per_round, "model": self.spec.model, "device": str(self.device), "task": self.spec.task,
            "wall_time_s": state.elapsed, "run_hash": self.run_hash, "init": init_note(self.spec),
            "client_models": "client_models.pt" if self.spec.save_client_models else None,
            "client_models_round": self.keep_round if self.spec.save_client_models else None,
            "final": {k: v for k, v in last.items() if k not in ("round", "clients")},
            "spec": result_params(self.spec.to_dict()),  # what the run hash covers: tracking after the fact reads it
        }
        summary["clients_without_local_scores"] = unscored_clients(state.client_rows, self.task.primary_metric)
        summary.update(clients_without_holdout(self.spec.partition_path))
        primary = f"global_{self.task.primary_metric}"
        if primary in metrics and metrics[primary].notna().any():
            best = metrics.loc[metrics[primary].idxmax()]
            summary["best_round"] = int(best["round"])
            summary[f"best_{primary}"] = float(best[primary])
        io.write_json(run_dir / "summary.json", summary)
        return {"metrics": run_dir / "metrics.csv", "summary": run_dir / "summary.json"}


def epoch_losses(results: list[ClientResult]) -> dict[str, float]:
    """``train_loss_e<e>``: local epoch e's training loss, example-weighted over the clients that ran
    it (as ``train_loss``); the x-axis of GPAF Fig. 5b is (round - 1) * E + e."""
    epochs = sorted({int(m[1]) for r in results for k in r.metrics if (m := EPOCH_LOSS.fullmatch(k))})
    row = {}
    for e in epochs:
        have = [r for r in results if f"train_loss_e{e}" in r.metrics]
        row[f"train_loss_e{e}"] = float(np.average([r.metrics[f"train_loss_e{e}"] for r in have],
                                                   weights=[r.num_examples for r in have]))
    return row


def client_validation_row(results: list[ClientResult], metric_names, average: str) -> dict[str, float]:
    """``client_val_<m>``: the average over clients of their own models' validation metrics after local
    training; ``mean`` = every client counts once (the GPAF paper's "average ... across clients"),
    ``weighted`` = by validation examples. Clients without validation data (NaN) are left out."""
    if average not in ("mean", "weighted"):
        raise ValueError(f"client_validation = {average!r}: use mean or weighted")
    row = {}
    for m in metric_names:
        vals = np.array([r.metrics.get(f"{CLIENT_VAL}{m}", math.nan) for r in results], dtype=float)
        w = (np.ones(len(results)) if average == "mean"
             else np.array([r.metrics.get(f"{CLIENT_VAL}examples", 0.0) for r in results], dtype=float))
        ok = np.isfinite(vals) & (w > 0)
        row[f"{CLIENT_VAL}{m}"] = float(np.average(vals[ok], weights=w[ok])) if ok.any() else math.nan
    return row


class RoundClock:
    """How long each round took in this process, from its client sampling to its checkpoint: the
    progress lines' s/round and ETA come from these, so the start-up before round 1 (imports, data,
    model, Flower) and a resumed run's earlier rounds do not inflate them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start: float | None = None
        self.durations: list[float] = []

    def start(self) -> None:
        self._start = self._clock()

    def stop(self) -> None:
        if self._start is not None:
            self.durations.append(self._clock() - self._start)
            self._start = None

    def per_round(self) -> float | None:
        """Mean seconds per round so far; None before a round has ended."""
        return sum(self.durations) / len(self.durations) if self.durations else None


def progress_line(row: dict[str, Any], total: int, primary: str, per_round: float | None = None) -> str:
    """The log file's round line: train loss, the evaluated metrics, elapsed time and ETA (from
    ``per_round``, the rounds' own mean duration; without it, elapsed time over rounds)."""
    rnd, elapsed = row["round"], row["elapsed_s"]
    eta = (elapsed / rnd if per_round is None else per_round) * (total - rnd)
    parts = [f"round {rnd}/{total}", f"train_loss {row['train_loss']:.4f}"]
    for key in (f"global_{primary}", "global_balanced_accuracy", "global_loss", f"local_mean_{primary}", "growth_rate"):
        if key in row and row[key] == row[key]:
            parts.append(f"{key} {row[key]:.4f}")
    parts.append(f"elapsed {elapsed:.1f}s ETA {eta:.1f}s")
    return " | ".join(parts)


def console_line(spec: RunSpec, row: dict[str, Any], total: int, primary: str, per_round: float | None = None) -> str:
    """The console's round line: which job, round r/R, its main metric, seconds per round (``per_round``:
    the rounds' own mean duration; without it, elapsed time over rounds), ETA."""
    rnd, elapsed = row["round"], row["elapsed_s"]
    if per_round is None:
        per_round = elapsed / rnd
    metric = next((k for k in (f"global_{primary}", f"local_mean_{primary}") if k in row and row[k] == row[k]), None)
    shown = f"{metric} {row[metric]:.4f}" if metric else f"train_loss {row['train_loss']:.4f}"
    job = f"{spec.study}/{spec.dataset}/{spec.setting}/{spec.method}/seed{spec.seed}"
    return f"{job}: round {rnd}/{total} | {shown} | {per_round:.1f} s/round | ETA {_duration(per_round * (total - rnd))}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
