"""Experiment tracking (fl/tracking.py): a 2-round run writes real TensorBoard event files and a real MLflow
SQLite store with the run's numbers, never changes them, and a failing backend does not end the run."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import split_labels

from fedmedbench.data import synthetic
from fedmedbench.fl import tracking
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec, for_job, result_params
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tracking")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 160, "val": 40, "test": 80})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "dirichlet", 3, 0, {"alpha": 1.0, "min_size": 5},
                                                  num_classes=2))
    return d


def make_spec(workdir: Path, name: str, tracking_block: dict | None = None) -> RunSpec:
    return RunSpec(
        run_dir=str(workdir / name), study="trk", dataset="breastmnist", setting="dir", method="fedavg", seed=0,
        partition_path=str(workdir / "p.json"), sources={"base": str(workdir / "b.npz")}, image_size=28,
        train={"rounds": 2, "local_epochs": 1, "batch_size": 32, "lr": 0.05}, device="cpu", threads=1,
        tracking=tracking_block or {},
    )


@pytest.fixture(scope="module")
def tracked(workdir):
    """One 2-round run with TensorBoard and MLflow on, and the same run with tracking off."""
    uri = f"sqlite:///{workdir}/store/mlflow.db"
    lines: list[str] = []
    on = make_spec(workdir, "on", {"tensorboard": True, "mlflow": uri})
    engine.run(on, log=lines.append)
    engine.run(make_spec(workdir, "off"), log=lambda m: None)
    return workdir, uri, lines


def test_tracking_changes_neither_results_nor_run_hash(tracked):
    workdir, _, lines = tracked
    assert not [line for line in lines if line.startswith("tracking:")], lines
    on, off = workdir / "on", workdir / "off"
    assert (on / "model.pt").read_bytes() == (off / "model.pt").read_bytes()
    drop = ["elapsed_s"]
    pd.testing.assert_frame_equal(pd.read_csv(on / "metrics.csv").drop(columns=drop),
                                  pd.read_csv(off / "metrics.csv").drop(columns=drop))
    assert json.loads((on / "summary.json").read_text())["run_hash"] == json.loads((off / "summary.json").read_text())["run_hash"]
    assert not (off / "tensorboard").exists()


def test_event_files_hold_each_rounds_and_each_clients_metrics(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir, _, _ = tracked
    events = EventAccumulator(str(workdir / "on" / "tensorboard"))
    events.Reload()
    metrics = pd.read_csv(workdir / "on" / "metrics.csv")
    scalars = {e.step: e.value for e in events.Scalars("global_accuracy")}
    assert sorted(scalars) == [1, 2]
    for rnd, value in scalars.items():
        assert value == pytest.approx(metrics.loc[metrics["round"] == rnd, "global_accuracy"].item(), abs=1e-6)
    clients = pd.read_csv(workdir / "on" / "client_metrics.csv")
    for c in range(3):
        local = {e.step: e.value for e in events.Scalars(f"client{c}/local_accuracy")}
        expect = clients[clients["client"] == c].set_index("round")["local_accuracy"]
        assert local == pytest.approx(expect.to_dict(), abs=1e-6)
        assert [e.step for e in events.Scalars(f"client{c}/train_loss")] == [1, 2]


def test_mlflow_store_lists_the_run_with_its_params_hash_and_rounds(tracked):
    from mlflow.tracking import MlflowClient

    workdir, uri, _ = tracked
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("trk")
    (run,) = client.search_runs([experiment.experiment_id])
    summary = json.loads((workdir / "on" / "summary.json").read_text())
    assert run.info.status == "FINISHED" and run.info.run_name == "breastmnist/dir/fedavg/seed0"
    assert run.data.tags["run_hash"] == summary["run_hash"]
    assert run.data.tags["run_dir"] == str(workdir / "on")
    params = run.data.params
    assert (params["method"], params["train.lr"], params["train.rounds"], params["seed"]) == ("fedavg", "0.05", "2", "0")
    assert params["train.momentum"] == "0.0"  # the resolved train block: defaults too
    assert "threads" not in params and "tracking" not in params  # only what the run hash covers
    metrics = pd.read_csv(workdir / "on" / "metrics.csv")
    history = client.get_metric_history(run.info.run_id, "global_accuracy")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
        list(zip(metrics["round"], metrics["global_accuracy"], strict=True))
    assert len(client.get_metric_history(run.info.run_id, "client2/local_accuracy")) == 2


def test_a_failing_store_is_named_once_and_the_run_completes(workdir):
    blocker = workdir / "not_a_folder"
    blocker.write_text("a file where the store's folder should be")
    lines: list[str] = []
    block = {"mlflow": f"sqlite:///{blocker}/mlflow.db"}
    if importlib.util.find_spec("wandb") is None:
        block["wandb"] = "offline"
    spec = make_spec(workdir, "failing", block)
    engine.run(spec, log=lines.append)
    assert (workdir / "failing" / "summary.json").is_file()
    named = [line for line in lines if line.startswith("tracking:")]
    assert len([line for line in named if "mlflow" in line]) == 1, named
    if "wandb" in block:
        assert len([line for line in named if "not installed" in line and "wandb off for this run" in line]) == 1, named
    assert len(named) == len(block), named


def test_tracking_is_a_runtime_field(workdir):
    spec = make_spec(workdir, "x")
    assert dataclasses.replace(spec, tracking={"tensorboard": True}).run_hash() == spec.run_hash()
    params = result_params(spec.to_dict())
    assert "tracking" not in params  # not in a rule's params: turning tracking on reruns no job
    config = {"engine": {}, "tracking": {"tensorboard": True, "mlflow": False}}
    assert for_job(params, 1, config).tracking == config["tracking"]


def test_options_resolve_the_config_block():
    assert tracking.options({"mlflow": True})["mlflow"] == tracking.DEFAULT_MLFLOW_URI
    assert tracking.options({"mlflow": "sqlite:///x.db"})["mlflow"] == "sqlite:///x.db"
    assert tracking.options({}) == {"tensorboard": False, "mlflow": None, "wandb": None, "client_metrics": True}
    assert tracking.options({"wandb": "offline"})["wandb"] == "offline"


def test_round_values_name_each_client_and_drop_what_was_not_measured():
    row = {"round": 3, "clients": 2, "train_loss": 0.5, "global_accuracy": float("nan"), "datafree_stop": False}
    clients = [{"round": 3, "client": 1, "local_accuracy": np.float32(0.75)}]  # evaluation rows may hold NumPy numbers
    trained = {0: {"train_loss": 0.4}, 1: {"train_loss": 0.6}}
    assert tracking.round_values(row, clients, trained, clients=True) == {
        "clients": 2.0, "train_loss": 0.5, "datafree_stop": 0.0, "client0/train_loss": 0.4,
        "client1/train_loss": 0.6, "client1/local_accuracy": 0.75}
    assert tracking.round_values(row, clients, trained, clients=False) == {"clients": 2.0, "train_loss": 0.5,
                                                                           "datafree_stop": 0.0}


def test_a_resumed_job_continues_its_mlflow_run_and_a_fresh_one_starts_anew(workdir):
    """An interrupted job (run FAILED after round 1) resumes into the same MLflow run; a job that starts again at
    round 1 gets a new run, and its event files replace the earlier run's."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    uri = f"sqlite:///{workdir}/resume/mlflow.db"
    spec = make_spec(workdir, "resumed")
    params = tracking.run_params(spec)

    def session(first_round: int, rounds: list[int], ok: bool) -> None:
        t = tracking.Tracker([tracking.MLflow(uri, spec, "h1", params), tracking.TensorBoard(spec.run_dir)], print)
        for rnd in rounds:
            t.round({"round": rnd, "global_accuracy": rnd / 10}, [], {})
        t.close(ok=ok)
        assert t.first_round == first_round

    session(1, [1], ok=False)   # killed after round 1
    session(2, [2, 3], ok=True)  # resumed from the round-1 checkpoint
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    assert run.info.status == "FINISHED"
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "global_accuracy")) == \
        [(1, 0.1), (2, 0.2), (3, 0.3)]

    session(1, [1], ok=True)  # the job again from round 1 (e.g. after resume: restart)
    runs = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    assert len(runs) == 2
    events = EventAccumulator(str(Path(spec.run_dir) / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("global_accuracy")] == [(1, 0.1)]


@pytest.mark.slow
def test_a_locked_store_is_named_once_and_its_rounds_arrive_when_it_frees(workdir):
    """Another process holds the SQLite store locked through round 1: the job logs it once, trains on, and
    sends round 1 with round 2 once the lock is gone (MLflow waits its busy timeout, about 20 s, first)."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    db = workdir / "locked" / "mlflow.db"
    uri = f"sqlite:///{db}"
    db.parent.mkdir()
    MlflowClient(tracking_uri=uri).create_experiment("trk")  # an existing store, as after a study's first job
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("tracking:"):
            holder.execute("COMMIT")  # the other process is done

    engine.run(make_spec(workdir, "locked_run", {"mlflow": uri}), log=log)
    holder.close()
    named = [line for line in lines if line.startswith("tracking:")]
    assert len(named) == 1 and "locked" in named[0], named
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    metrics = pd.read_csv(workdir / "locked_run" / "metrics.csv")
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "global_accuracy")) == \
        list(zip(metrics["round"], metrics["global_accuracy"], strict=True))
    assert run.info.status == "FINISHED"


class ConsoleLog:
    """A job's log as the entry scripts give it (``JobLog``): ``console`` lines reach the user's terminal."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.console_lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def console(self, line: str) -> None:
        self(line)
        self.console_lines.append(line)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_an_mlflow_url_without_a_server_is_given_up_at_the_jobs_start_in_seconds(workdir):
    """No server on the port: the job's start says so once on the console and leaves MLflow out (it retried over
    HTTP for minutes each round: 705 s for a 2-round job); the run completes."""
    import time

    uri = f"http://127.0.0.1:{_closed_port()}"
    log = ConsoleLog()
    spec = make_spec(workdir, "no_server", {"mlflow": uri})
    t0 = time.monotonic()
    tracker = tracking.for_run(spec, spec.run_hash(), None, log)
    tracker.round({"round": 1, "global_accuracy": 0.5}, [], {})
    tracker.close()
    assert time.monotonic() - t0 < 10
    assert tracker.backends == []
    (line,) = log.console_lines
    assert line.startswith(f"tracking: mlflow off for this run: no MLflow server answers at {uri} within 5 s") and \
        line.endswith("the run goes on (config key 'tracking.mlflow')"), line
    log = ConsoleLog()
    engine.run(spec, log=log)
    assert (workdir / "no_server" / "summary.json").is_file()
    assert len([line for line in log.console_lines if line.startswith("tracking:")]) == 1, log.console_lines


@pytest.mark.parametrize("uri", ["sqlite:////proc/fedmedbench/mlflow.db", "file:///proc/fedmedbench/mlruns",
                                 "/proc/fedmedbench/mlruns"])
def test_an_unwritable_store_is_named_on_the_console_at_the_jobs_start(workdir, uri):
    """It was named in the job's log only, after the first round."""
    log = ConsoleLog()
    spec = make_spec(workdir, "unwritable", {"mlflow": uri, "tensorboard": True})
    tracker = tracking.for_run(spec, spec.run_hash(), None, log)
    assert [b.backend.name for b in tracker.backends] == ["tensorboard"]
    (line,) = log.console_lines
    assert line.startswith(f"tracking: mlflow off for this run: the store {uri} cannot be written (") and "/proc" in line
    assert log.lines == log.console_lines


def test_a_writable_store_and_a_live_server_pass_the_look_at_the_start(workdir):
    import http.server
    import threading

    assert tracking.store_problem(f"sqlite:///{workdir}/fresh/mlflow.db") is None
    assert (workdir / "fresh").is_dir() and not (workdir / "fresh" / "mlflow.db").exists()  # no store made by looking
    assert tracking.store_problem(f"file://{workdir}/mlruns") is None
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501: a server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert tracking.store_problem(f"http://127.0.0.1:{server.server_address[1]}") is None
    finally:
        server.shutdown()
    assert tracking.store_problem("databricks") is None  # not looked at


def test_a_failure_during_the_run_is_said_on_the_console_once(workdir):
    class Failing:
        name = "mlflow"

        def start(self, fresh):
            raise RuntimeError("database is locked")

    log = ConsoleLog()
    tracker = tracking.Tracker([Failing()], log)
    for rnd in (1, 2, 3, 4):
        tracker.round({"round": rnd, "global_accuracy": 0.5}, [], {})
    (line,) = log.console_lines
    assert line.startswith("tracking: mlflow start failed (RuntimeError: database is locked); the run goes on"), line


# --- after the fact: a finished run's files into the same backends -------------------------------------------------

def _hparams(folder: Path):
    """The TensorBoard hparams of the run in ``folder``: (hyper-parameters by name, metric names)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata as hp
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent(hp.PLUGIN_NAME)
    start = HParamsPluginData.FromString(content[hp.SESSION_START_INFO_TAG]).session_start_info
    experiment = HParamsPluginData.FromString(content[hp.EXPERIMENT_TAG]).experiment
    values = {k: (v.string_value if v.HasField("string_value") else v.bool_value if v.HasField("bool_value")
                  else v.number_value) for k, v in start.hparams.items()}
    return values, {m.name.tag for m in experiment.metric_infos}, events


def test_a_live_run_ends_with_its_hparams_in_tensorboard(tracked):
    workdir, uri, _ = tracked
    values, metrics, _ = _hparams(workdir / "on" / "tensorboard")
    assert (values["method"], values["train.lr"], values["train.rounds"], values["seed"]) == ("fedavg", 0.05, 2, 0)
    assert values["train.optimizer"] == "sgd" and "train.grad_clip" not in values  # null: left out
    assert {"global_accuracy", "train_loss"} <= metrics and not any("/" in m for m in metrics)


def test_backfill_logs_a_finished_run_as_live_tracking_would(tracked, tmp_path):
    """The untracked twin of the tracked run, logged from its files alone: the same params as the live run, each
    round's metrics and each client's evaluation rows, hparams; a second call adds nothing, force logs again."""
    from mlflow.tracking import MlflowClient

    workdir, live_uri, _ = tracked
    off = workdir / "off"
    model = (off / "model.pt").read_bytes()
    uri = f"sqlite:///{tmp_path}/after.db"
    assert {workdir / "on", off} <= set(tracking.finished_runs([str(workdir)]))  # a folder above runs: each run
    assert tracking.main(["backfill", str(off), "--mlflow", uri, "--tensorboard"]) == 0
    assert (off / "model.pt").read_bytes() == model  # nothing trained or rewritten

    client, live = MlflowClient(tracking_uri=uri), MlflowClient(tracking_uri=live_uri)
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("trk").experiment_id])
              if r.data.tags["run_dir"] == str(off)]
    (live_run,) = live.search_runs([live.get_experiment_by_name("trk").experiment_id])
    summary = json.loads((off / "summary.json").read_text())
    assert run.info.status == "FINISHED" and run.info.run_name == "breastmnist/dir/fedavg/seed0"
    assert run.data.tags["run_hash"] == summary["run_hash"] == live_run.data.tags["run_hash"]
    assert run.data.params == live_run.data.params and len(run.data.params) > 30
    metrics = pd.read_csv(off / "metrics.csv")
    history = client.get_metric_history(run.info.run_id, "global_accuracy")
    assert sorted((m.step, m.value) for m in history) == list(zip(metrics["round"], metrics["global_accuracy"], strict=True))
    clients = pd.read_csv(off / "client_metrics.csv")
    local = client.get_metric_history(run.info.run_id, "client1/local_accuracy")
    assert sorted((m.step, m.value) for m in local) == \
        list(clients[clients["client"] == 1][["round", "local_accuracy"]].itertuples(index=False, name=None))

    values, names, events = _hparams(off / "tensorboard")
    assert (values["method"], values["train.lr"], values["partition_path"]) == ("fedavg", 0.05, str(workdir / "p.json"))
    assert {"global_accuracy", "global_f1"} <= names
    assert [(e.step, e.value) for e in events.Scalars("global_accuracy")] == \
        [(r, pytest.approx(v, abs=1e-6)) for r, v in zip(metrics["round"], metrics["global_accuracy"], strict=True)]

    line = tracking.backfill(off, {"tensorboard": True, "mlflow": uri}, print)
    assert line.startswith("nothing new logged") and f"mlflow already has run {run.info.run_id}" in line
    tracking.backfill(off, {"mlflow": uri}, print, force=True)
    assert len([r for r in client.search_runs([run.info.experiment_id]) if r.data.tags["run_dir"] == str(off)]) == 2


def test_backfill_of_a_run_from_before_summaries_held_the_spec(tracked, tmp_path):
    """Its spec from the params Snakemake recorded with its summary.json; without that record, the summary's fields."""
    import base64
    import shutil

    workdir, _, _ = tracked
    root = tmp_path / "wf"
    run = root / "results" / "trk" / "breastmnist" / "dir" / "fedavg" / "seed0"
    shutil.copytree(workdir / "off", run)
    summary = json.loads((run / "summary.json").read_text())
    spec = summary.pop("spec")
    (run / "summary.json").write_text(json.dumps(summary))
    uri = f"sqlite:///{tmp_path}/old.db"
    line = tracking.backfill(run, {"mlflow": uri}, print)
    assert "params from the summary fields (no spec recorded)" in line
    name, params, _ = tracking.run_identity(run, summary)
    assert (name.method, params["seed"], params["model"]) == ("fedavg", "0", "cnn_small") and "train.lr" not in params

    rel = "results/trk/breastmnist/dir/fedavg/seed0/summary.json"
    record = root / ".snakemake" / "metadata" / base64.urlsafe_b64encode(rel.encode()).decode()
    record.parent.mkdir(parents=True)
    recorded = {**spec, "run_dir": "results/trk/breastmnist/dir/fedavg/seed0"}
    record.write_text(json.dumps({"rule": "train_federated", "params": ["4", repr(recorded)]}))  # Snakemake: repr of each param
    got, params, source = tracking.run_identity(run, summary)
    assert source == "spec" and got.run_dir == recorded["run_dir"]
    assert (params["train.lr"], params["train.momentum"]) == ("0.05", "0.0")  # the train block resolved, as live


def test_backfill_names_what_is_not_a_finished_run(tracked, tmp_path):
    assert tracking.main(["backfill", str(tmp_path)]) == 1
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        tracking.backfill(tmp_path, {"tensorboard": True}, print)
    from fedmedbench.studies.grid import show_run

    show_run(tracked[0] / "off", tmp_path / "shown", "iid")  # a run shown in a setting that shares it
    line = tracking.backfill(tmp_path / "shown", {"tensorboard": True}, print)
    assert line == "nothing logged: a copy of the run trained in setting dir (logged there)"
    assert not (tmp_path / "shown" / "tensorboard").exists()
