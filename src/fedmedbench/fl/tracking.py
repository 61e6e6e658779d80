"""Live experiment tracking of one job: each round's metrics (and each client's) to TensorBoard event files,
an MLflow store and W&B in offline mode, as the config's ``tracking`` block asks.

Tracking only reads what a round already computed, after the round: it never changes a run's numbers, and
``RunSpec.tracking`` is a runtime field, so never its hash. A backend that fails (a locked store, a missing
package, an unwritable folder) is named once on the job's console and in its log, and the run goes on: its
rounds are kept and sent again with the next round, and after :data:`MAX_FAILURES` failures in a row it is
given up for the run. The MLflow store is looked at when the job starts (:func:`store_problem`: a server
that does not answer within :data:`PROBE_TIMEOUT_S`, a folder that cannot be written): one that cannot
work is named then and left out of the run, not retried over HTTP for minutes each round; MLflow's own
HTTP retries are shortened for the job (:data:`MLFLOW_HTTP_DEFAULTS`, where the environment sets none).

Where things go: TensorBoard ``<run folder>/tensorboard`` (``tensorboard --logdir results``); MLflow one
experiment per study, one run per job (name ``dataset/setting/method/seed<k>``, every hyper-parameter of the
run hash as a param, ``run_hash`` and ``run_dir`` as tags; default store :data:`DEFAULT_MLFLOW_URI`); W&B
``<run folder>/wandb`` (``wandb sync`` uploads it), only where the ``wandb`` package is installed. A resumed
job continues its MLflow and W&B run and its event files; a job that starts at round 1 starts them anew. A run
that ends well gets TensorBoard hparams: its hyper-parameters and its last value of each round metric.

Finished runs are logged after the fact from their files, through the same backends and the same per-round
calls, without training (:func:`backfill`): ``python -m fedmedbench.fl.tracking backfill results/<study>``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fedmedbench.fl.spec import RunSpec, result_params

#: the MLflow store of ``mlflow: true``: a SQLite file under the workflow's results/
DEFAULT_MLFLOW_URI = "sqlite:///results/mlflow.db"
#: failures in a row after which a backend is given up for the run
MAX_FAILURES = 3
#: seconds an MLflow server gets to answer when the job starts
PROBE_TIMEOUT_S = 5.0
#: MLflow's HTTP settings for a job (its defaults: 7 retries with doubling waits and 120 s time-outs per request,
#: minutes per round when the server is gone); a variable the environment already sets is kept
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
#: MLflow's largest batch of one request (params, metrics)
_MLFLOW_PARAMS_PER_BATCH, _MLFLOW_METRICS_PER_BATCH = 100, 1000


@dataclasses.dataclass
class RunName:
    """What names a run in the backends, where its full spec is not recorded (a run from before summaries held it)."""

    run_dir: str
    study: str
    dataset: str
    setting: str
    method: str
    seed: int


class Unavailable(RuntimeError):
    """A backend that cannot work in this environment (its package is missing): given up at once."""


def options(tracking: dict[str, Any] | None) -> dict[str, Any]:
    """The config block with every key resolved: tensorboard (bool), mlflow (a URI or None), wandb ("offline"
    or None), client_metrics (bool)."""
    t = tracking or {}
    mlflow = t.get("mlflow", False)
    return {
        "tensorboard": bool(t.get("tensorboard", False)),
        "mlflow": DEFAULT_MLFLOW_URI if mlflow is True else (mlflow or None),
        "wandb": "offline" if t.get("wandb") in (True, "offline") else None,
        "client_metrics": bool(t.get("client_metrics", True)),
    }


def store_problem(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the MLflow store at ``uri`` cannot take a job's metrics; None where a quick look finds nothing wrong.

    An ``http(s)`` server must answer (any HTTP status) within ``timeout``; a ``sqlite:`` or ``file:`` store (or
    a plain path) needs a folder this process can create and write, and a database file it can write. Other
    schemes (``databricks``, say) are not looked at."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
                return None
        except urllib.error.HTTPError:
            return None  # a server answered
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return f"no MLflow server answers at {uri} within {timeout:g} s ({getattr(exc, 'reason', exc)})"
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if str(db) in (":memory:", ""):
            return None
        folder = db.parent
    elif uri.startswith("file:"):
        folder = db = Path(urllib.request.url2pathname(uri[len("file:"):].removeprefix("//")))
    elif "://" not in uri:
        folder = db = Path(uri)
    else:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        if db.is_file():
            with open(db, "r+b"):
                pass
    except OSError as exc:
        return f"the store {uri} cannot be written ({exc.strerror or exc}: {exc.filename or folder})"
    return None


def run_params(spec: RunSpec, train: Any = None) -> dict[str, str]:
    """Every field the run hash covers, flattened (``train.lr``, ``method_params.mu``) as text; ``train`` as
    the job resolved it (defaults filled) when given."""
    fields = result_params(spec.to_dict())
    fields.pop("run_dir")
    if dataclasses.is_dataclass(train):
        fields["train"] = dataclasses.asdict(train)
    return _flatten(fields)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return out


def round_values(row: dict[str, Any], client_rows: list[dict[str, Any]], client_metrics: dict[int, dict[str, Any]],
                 clients: bool) -> dict[str, float]:
    """One round's numbers by name: the metrics row, and with ``clients`` ``client<i>/<metric>`` from each
    client's training reply and evaluation row. Non-numbers and NaN (not evaluated this round) are left out."""
    values = {k: v for k, v in row.items() if k != "round"}
    if clients:
        for pid, metrics in client_metrics.items():
            values.update({f"client{pid}/{k}": v for k, v in metrics.items()})
        for c in client_rows:
            values.update({f"client{c['client']}/{k}": v for k, v in c.items() if k not in ("round", "client")})
    return {k: float(v) for k, v in values.items() if isinstance(v, numbers.Real) and math.isfinite(float(v))}


class Backend(Protocol):
    """One tracking service: ``start`` once (``fresh``: the job starts at round 1), ``log`` each round."""

    name: str

    def start(self, fresh: bool) -> None: ...

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self, ok: bool) -> None: ...


class TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: str, params: dict[str, str] | None = None) -> None:
        self.folder = Path(run_dir) / "tensorboard"
        self.params = params or {}
        self.writer = None
        self.last: dict[str, float] = {}  # each round metric's last value: the hparams' metrics

    def start(self, fresh: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if fresh and self.folder.exists():  # an earlier run of this job: its curves are not this run's
            shutil.rmtree(self.folder)
        self.writer = SummaryWriter(log_dir=str(self.folder))

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.last.update({k: v for k, v in values.items() if "/" not in k})
        self.writer.flush()  # live: visible in TensorBoard as the round ends

    def close(self, ok: bool) -> None:
        if self.writer is None:
            return
        if ok and self.params:  # the HParams dashboard's row of this run: its metrics are the scalars logged above
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams({k: hparam_value(v) for k, v in sorted(self.params.items())}, dict(sorted(self.last.items()))):
                self.writer.file_writer.add_summary(summary)
        self.writer.close()


def hparam_value(text: str) -> float | bool | str | None:
    """A flattened param (:func:`run_params`) as TensorBoard hparams take it: a number or bool as such, null as
    None (left out), a list or anything else as its text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if value is None or isinstance(value, (bool, int, float, str)) else text


class MLflow:
    name = "mlflow"

    def __init__(self, uri: str, spec: RunSpec, run_hash: str, params: dict[str, str]) -> None:
        self.uri, self.spec, self.run_hash, self.params = uri, spec, run_hash, params
        self.client = None
        self.run_id: str | None = None

    def start(self, fresh: bool) -> None:
        for name, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        if self.uri.startswith("sqlite:///"):  # SQLite makes the file, not its folder
            Path(self.uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=self.uri)
        experiment = self._experiment(client)
        tags = {"run_hash": self.run_hash, "run_dir": self.spec.run_dir}
        run = None if fresh else self._unfinished_run(client, experiment)
        if run is None:
            s = self.spec
            run = client.create_run(experiment, run_name=f"{s.dataset}/{s.setting}/{s.method}/seed{s.seed}", tags=tags)
            self._log_params(client, run.info.run_id)
        else:
            client.update_run(run.info.run_id, status="RUNNING")
        self.client, self.run_id = client, run.info.run_id

    def _experiment(self, client) -> str:
        found = client.get_experiment_by_name(self.spec.study)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(self.spec.study)
        except Exception:  # noqa: BLE001 - another job made it first
            return client.get_experiment_by_name(self.spec.study).experiment_id

    def _unfinished_run(self, client, experiment: str):
        runs = client.search_runs([experiment], filter_string=f"tags.run_hash = '{self.run_hash}'",
                                  order_by=["attributes.start_time DESC"])
        return next((r for r in runs if r.data.tags.get("run_dir") == self.spec.run_dir and r.info.status != "FINISHED"),
                    None)

    def finished_run(self) -> str | None:
        """The id of a finished MLflow run of this job (same run hash and folder) already in the store."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        found = client.get_experiment_by_name(self.spec.study)
        if found is None:
            return None
        runs = client.search_runs([found.experiment_id], filter_string=f"tags.run_hash = '{self.run_hash}'")
        return next((r.info.run_id for r in runs
                     if r.data.tags.get("run_dir") == self.spec.run_dir and r.info.status == "FINISHED"), None)

    def _log_params(self, client, run_id: str) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(self.params.items())]
        for i in range(0, len(items), _MLFLOW_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=items[i:i + _MLFLOW_PARAMS_PER_BATCH])

    def log(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(items), _MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + _MLFLOW_METRICS_PER_BATCH])

    def close(self, ok: bool) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")


class Wandb:
    name = "wandb"

    def __init__(self, spec: RunSpec, run_hash: str, params: dict[str, str]) -> None:
        self.spec, self.run_hash, self.params = spec, run_hash, params
        self.run = None

    def start(self, fresh: bool) -> None:
        try:
            import wandb
        except ImportError:
            raise Unavailable("the wandb package is not installed (pip install wandb)") from None
        s = self.spec
        folder = Path(s.run_dir)
        if fresh and (folder / "wandb").exists():
            shutil.rmtree(folder / "wandb")
        self.run = wandb.init(project=s.study, name=f"{s.dataset}/{s.setting}/{s.method}/seed{s.seed}", id=self.run_hash,
                              resume="allow", config=self.params, dir=str(folder), mode="offline",
                              tags=[f"run_hash:{self.run_hash}"])

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self, ok: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)


def _console(log: Callable[[str], None]) -> Callable[[str], None]:
    """Where a line goes to the job's console as well as its log (``JobLog.console``); else ``log`` itself."""
    return getattr(log, "console", log)


class _Guarded:
    """A backend whose failures never reach the run: the first is said (console and log), rounds wait for the next try."""

    def __init__(self, backend: Backend, log: Callable[[str], None]) -> None:
        self.backend, self.log = backend, _console(log)
        self.started = False
        self.failures = 0  # in a row
        self.given_up = False
        self.reported = False
        self.pending: list[tuple[int, dict[str, float]]] = []

    def _try(self, what: str, call: Callable[[], None]) -> bool:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - tracking must not end a training run
            self.failures += 1
            self.given_up = self.failures >= MAX_FAILURES or isinstance(exc, Unavailable)
            if not self.reported:
                self.reported = True
                then = ("off for this run" if self.given_up else
                        f"retried with the next rounds, given up after {MAX_FAILURES} failures in a row")
                self.log(f"tracking: {self.backend.name} {what} failed ({type(exc).__name__}: {exc}); the run goes on, "
                         f"{self.backend.name} {then}")
            return False
        self.failures = 0
        return True

    def round(self, step: int, values: dict[str, float], fresh: bool) -> None:
        if self.given_up:
            return
        self.pending.append((step, values))
        if not self.started:
            self.started = self._try("start", lambda: self.backend.start(fresh))
            if not self.started:
                return
        while self.pending and self._try("logging", lambda: self.backend.log(*self.pending[0])):
            self.pending.pop(0)

    def close(self, ok: bool) -> None:
        if self.started and not self.given_up:
            self._try("closing", lambda: self.backend.close(ok))


class Tracker:
    """The job's tracking backends; :meth:`round` after each round's metrics, :meth:`close` at the end."""

    def __init__(self, backends: list[Backend], log: Callable[[str], None], client_metrics: bool = True) -> None:
        self.backends = [_Guarded(b, log) for b in backends]
        self.client_metrics = client_metrics
        self.first_round: int | None = None

    def round(self, row: dict[str, Any], client_rows: list[dict[str, Any]], results: dict[int, Any]) -> None:
        """Send one round: its metrics row, the clients' evaluation rows and training replies (``.metrics``)."""
        if not self.backends:
            return
        rnd = int(row["round"])
        if self.first_round is None:
            self.first_round = rnd
        values = round_values(row, client_rows, {p: r.metrics for p, r in sorted(results.items())}, self.client_metrics)
        for b in self.backends:
            b.round(rnd, values, fresh=self.first_round == 1)

    def close(self, ok: bool = True) -> None:
        for b in self.backends:
            b.close(ok)


def backends(opts: dict[str, Any], spec: RunSpec | RunName, run_hash: str, params: dict[str, str],
             log: Callable[[str], None] = print) -> list[Backend]:
    """The backends ``opts`` (:func:`options`) turns on, for one run: the same for live and after-the-fact logging.
    An MLflow store that cannot work (:func:`store_problem`) is said once on the console and left out."""
    out: list[Backend] = []
    if opts["tensorboard"]:
        out.append(TensorBoard(spec.run_dir, params))
    if opts["mlflow"]:
        problem = store_problem(opts["mlflow"])
        if problem is None:
            out.append(MLflow(opts["mlflow"], spec, run_hash, params))
        else:
            _console(log)(f"tracking: mlflow off for this run: {problem}; the run goes on (config key 'tracking.mlflow')")
    if opts["wandb"]:
        out.append(Wandb(spec, run_hash, params))
    return out


def for_run(spec: RunSpec, run_hash: str, train: Any, log: Callable[[str], None]) -> Tracker:
    """The tracker ``spec.tracking`` asks for (none: a tracker that does nothing)."""
    opts = options(spec.tracking)
    if not (opts["tensorboard"] or opts["mlflow"] or opts["wandb"]):
        return Tracker([], log)
    return Tracker(backends(opts, spec, run_hash, run_params(spec, train), log), log, opts["client_metrics"])


# --- after the fact: finished runs logged from their files -------------------------------------------------------

#: summary fields that are no hyper-parameter (results, timings, lists): left out of a run's params
_NOT_PARAMS = ("final", "wall_time_s", "rounds_run", "rounds_saved", "run_hash", "best_round", "device")


def recorded_spec(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's spec (its result fields): the summary's ``spec``, else the params Snakemake recorded with the
    run's summary.json in the workflow's ``.snakemake/metadata`` (runs from before summaries held it)."""
    if isinstance(summary.get("spec"), dict):
        return summary["spec"]
    import ast
    import base64

    target = (run_dir / "summary.json").resolve()
    for root in target.parents:
        if (root / ".snakemake" / "metadata").is_dir():
            rel = target.relative_to(root).as_posix()
            meta = root / ".snakemake" / "metadata"
            key = base64.urlsafe_b64encode(rel.encode()).decode()
            step = (os.pathconf(meta, "PC_NAME_MAX") or 255) - 1  # Snakemake's file store: long keys in folders '@...'
            chunks = [key[i:i + step] for i in range(0, len(key), step)]
            record = meta.joinpath(*[f"@{c}" for c in chunks[:-1]], chunks[-1])
            if not record.is_file():
                return None
            for text in json.loads(record.read_text()).get("params") or []:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
                for spec in value if isinstance(value, list) else [value]:  # seeds together: a list of specs
                    if isinstance(spec, dict) and Path(str(spec.get("run_dir", ""))).as_posix() == str(Path(rel).parent):
                        return spec
            return None
    return None


def run_identity(run_dir: Path, summary: dict[str, Any]) -> tuple[RunSpec | RunName, dict[str, str], str]:
    """The finished run's name, params and where they come from: its recorded spec with the train block resolved
    as the job resolved it (live tracking's params), else the summary's fields."""
    recorded = recorded_spec(run_dir, summary)
    if recorded is not None:
        try:
            spec = RunSpec.from_dict(recorded)
        except (TypeError, ValueError):
            spec = None
        if spec is not None:
            from fedmedbench.fl.api.method import TrainConfig

            try:
                train = TrainConfig.from_spec(spec)
            except (TypeError, ValueError):
                train = None
            return spec, run_params(spec, train), "spec"
    name = RunName(run_dir=str(run_dir), **{k: summary[k] for k in ("study", "dataset", "setting", "method", "seed")})
    fields = {k: v for k, v in summary.items() if k not in _NOT_PARAMS and (v is None or isinstance(v, (str, int, float, bool)))}
    return name, _flatten(fields), "summary fields (no spec recorded)"


def _rows(path: Path) -> list[dict[str, Any]]:
    """A metrics CSV as rows of Python numbers (NaN where a round was not evaluated)."""
    import pandas as pd

    if not path.is_file() or path.stat().st_size == 0:
        return []
    frame = pd.read_csv(path)
    return [{k: v.item() if hasattr(v, "item") else v for k, v in row.items()} for row in frame.to_dict("records")]


def backfill(run_dir: str | Path, tracking_block: dict[str, Any], log: Callable[[str], None], force: bool = False) -> str:
    """Log one finished run (its ``summary.json``, ``metrics.csv``, ``client_metrics.csv``) to the backends
    ``tracking_block`` turns on, round by round as a live run would (no training). A backend that already holds
    the run (event files; a finished MLflow run of the same hash and folder) is left alone unless ``force``.
    Returns one line saying what was logged. Client training replies are not in the files: only the clients'
    evaluation rows are logged per client."""
    run = Path(run_dir)
    summary_path = run / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{run}: no summary.json (not a finished run)")
    summary = json.loads(summary_path.read_text())
    if summary.get("trained_in", summary.get("setting")) != summary.get("setting"):  # studies/grid.py show_run
        return f"nothing logged: a copy of the run trained in setting {summary['trained_in']} (logged there)"
    rows = _rows(run / "metrics.csv")
    if not rows:
        raise FileNotFoundError(f"{run / 'metrics.csv'}: missing or empty (no rounds to log)")
    if "client" in rows[0]:
        raise ValueError(f"{run / 'metrics.csv'}: rows per client, not per round (a run trained outside the federation "
                         "engine, which tracks none)")
    spec, params, source = run_identity(run, summary)
    if Path(spec.run_dir).resolve() != run.resolve():  # recorded relative to the workflow, run from elsewhere
        spec = dataclasses.replace(spec, run_dir=str(run))
    opts = options(tracking_block)
    chosen, kept = [], []
    for b in backends(opts, spec, summary["run_hash"], params, log):
        if not force and isinstance(b, TensorBoard) and any(b.folder.glob("events.out.tfevents.*")):
            kept.append(f"tensorboard already has {b.folder}")
        elif not force and isinstance(b, MLflow) and (found := b.finished_run()):
            kept.append(f"mlflow already has run {found}")
        else:
            chosen.append(b)
    tracker = Tracker(chosen, log, opts["client_metrics"])
    by_round: dict[int, list[dict[str, Any]]] = {}
    for c in _rows(run / "client_metrics.csv"):
        by_round.setdefault(int(c["round"]), []).append(c)
    for row in rows:
        tracker.round(row, by_round.get(int(row["round"]), []), {})
    tracker.close(ok=True)
    done = [g.backend.name for g in tracker.backends if g.started and not g.given_up and not g.pending]
    failed = [g.backend.name for g in tracker.backends if g.backend.name not in done]
    logged = f"{len(rows)} rounds to {', '.join(done)}" if done else "nothing new logged"
    parts = [logged, f"{len(params)} params from the {source}"]
    return "; ".join(parts + kept + [f"{name} FAILED" for name in failed])


def finished_runs(paths: list[str]) -> list[Path]:
    """The run folders under each path (a run folder itself, or any folder above runs: every summary.json with a
    metrics.csv beside it), sorted, each once."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or folder")
        candidates = [p / "summary.json"] if (p / "summary.json").is_file() else sorted(p.rglob("summary.json"))
        found.update(c.parent for c in candidates if (c.parent / "metrics.csv").is_file())
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    """``python -m fedmedbench.fl.tracking backfill RUN...``: finished runs into TensorBoard and MLflow."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m fedmedbench.fl.tracking",
                                     description="Log finished runs into TensorBoard / MLflow from their files.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("backfill", help="log finished runs (no training)")
    b.add_argument("runs", nargs="+", help="run folders, or folders above them (e.g. results/<study>)")
    b.add_argument("--tensorboard", action="store_true", help="event files in <run>/tensorboard")
    b.add_argument("--mlflow", nargs="?", const=True, default=False, metavar="URI",
                   help=f"an MLflow store (default {DEFAULT_MLFLOW_URI})")
    b.add_argument("--wandb", action="store_true", help="W&B offline runs (where wandb is installed)")
    b.add_argument("--no-client-metrics", action="store_true", help="only the round metrics, no client<i>/ tags")
    b.add_argument("--force", action="store_true", help="log again runs a backend already holds")
    args = parser.parse_args(argv)
    block = {"tensorboard": args.tensorboard, "mlflow": args.mlflow, "wandb": "offline" if args.wandb else False,
             "client_metrics": not args.no_client_metrics}
    if not (args.tensorboard or args.mlflow or args.wandb):  # as the paper configs track
        block.update(tensorboard=True, mlflow=True)
    try:
        runs = finished_runs(args.runs)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not runs:
        print(f"error: no finished run (summary.json with metrics.csv) under {' '.join(args.runs)}", file=sys.stderr)
        return 1
    failed = 0
    for run in runs:
        try:
            line = backfill(run, block, lambda m: print(m, file=sys.stderr), force=args.force)
        except (OSError, ValueError, KeyError) as exc:
            line = f"FAILED: {exc}"
        failed += "FAILED" in line
        print(f"{run}: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
