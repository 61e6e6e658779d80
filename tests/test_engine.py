"""FL engine: aggregation, seeded sampling, equal-compute centralized, resume after SIGKILL, client failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import split_labels

from fedmedbench.data import synthetic
from fedmedbench.fl.api.arrays import weighted_average
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state.file_format import read_state
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 600, "val": 60, "test": 120})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "dirichlet", 4, 0, {"alpha": 1.0}, num_classes=2))
    return d


def make_spec(workdir: Path, name: str, method="fedavg", rounds=3, model="cnn_small", **train) -> RunSpec:
    return RunSpec(
        run_dir=str(workdir / name), study="t", dataset="breastmnist", setting="dir", method=method, seed=0,
        partition_path=str(workdir / "p.json"), sources={"base": str(workdir / "b.npz")}, image_size=28,
        train={"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9, **train},
        device="cpu", threads=2, model=model,
    )


def run_in_subprocess(spec: RunSpec) -> subprocess.Popen:
    code = ("import json,sys; from fedmedbench.fl.spec import RunSpec; from fedmedbench.fl.engine import flower as engine; "
            "engine.run(RunSpec.from_dict(json.loads(sys.argv[1])))")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(spec.to_dict())], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def checkpoint_round(run_dir: Path) -> int:
    path = run_dir / "checkpoint" / "server.pt"
    if not path.exists():
        return 0
    try:
        return int(read_state(path)["round"])
    except Exception:  # noqa: BLE001 - being replaced right now
        return 0


def test_weighted_average_is_example_weighted():
    a = {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(10)}
    b = {"w": torch.tensor([4.0, 6.0]), "n": torch.tensor(20)}
    out = weighted_average([a, b], [1, 3])
    np.testing.assert_allclose(out["w"], [3.0, 5.0])
    assert out["w"].dtype == torch.float32 and out["n"].dtype == torch.int64 and int(out["n"]) == 18
    with pytest.raises(ValueError):
        weighted_average([], [])


def test_sampling_is_seeded_by_round_not_nodes(workdir):
    spec = make_spec(workdir, "s", rounds=3)
    spec.clients_per_round = 2
    f1, f2 = fed.Federation(spec, log=lambda m: None), fed.Federation(spec, log=lambda m: None)
    assert [f1.sample(r) for r in range(1, 6)] == [f2.sample(r) for r in range(1, 6)]
    assert all(len(f1.sample(r)) == 2 for r in range(1, 6))
    assert len({tuple(f1.sample(r)) for r in range(1, 20)}) > 1


def test_centralized_gets_the_federation_step_budget(workdir):
    fa = fed.Federation(make_spec(workdir, "a"), log=lambda m: None)
    ce = fed.Federation(make_spec(workdir, "c", method="centralized"), log=lambda m: None)
    assert ce.num_nodes == 1 and ce.sample(1) == [0]
    assert ce.steps(0) == sum(fa.steps(p) for p in range(fa.num_clients))


def test_unknown_method_is_named():
    with pytest.raises(KeyError, match="unknown method 'fedfoo'"):
        get_method("fedfoo")


@pytest.mark.slow
def test_resume_after_kill_is_bit_identical(workdir):
    rounds = 6
    ref = make_spec(workdir, "ref", rounds=rounds, local_epochs=2)
    proc = run_in_subprocess(ref)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out

    killed = make_spec(workdir, "killed", rounds=rounds, local_epochs=2)
    proc = run_in_subprocess(killed)
    deadline = time.monotonic() + 300
    while checkpoint_round(Path(killed.run_dir)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = checkpoint_round(Path(killed.run_dir))
    assert 2 <= at_kill < rounds, "the kill must land mid-run"
    assert not (Path(killed.run_dir) / "summary.json").exists()

    proc = run_in_subprocess(killed)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert f"resuming from checkpoint at round {at_kill}/{rounds}" in out

    a = torch.load(Path(ref.run_dir) / "model.pt", weights_only=True)
    b = torch.load(Path(killed.run_dir) / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma = pd.read_csv(Path(ref.run_dir) / "metrics.csv").drop(columns="elapsed_s")
    mb = pd.read_csv(Path(killed.run_dir) / "metrics.csv").drop(columns="elapsed_s")
    pd.testing.assert_frame_equal(ma, mb)
    assert json.loads((Path(killed.run_dir) / "summary.json").read_text())["rounds_run"] == rounds


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inline", "ray"])
def test_client_failure_fails_the_job_with_its_traceback(workdir, backend):
    spec = make_spec(workdir, f"nan-{backend}", rounds=3, lr=1e30, momentum=0.0)
    spec.backend = backend
    proc = run_in_subprocess(spec)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0
    assert "ClientFailure" in out and "NonFiniteLossError" in out and "lower train.lr" in out
    assert "Traceback" in out
    assert not (Path(spec.run_dir) / "metrics.csv").exists()


@pytest.mark.slow
def test_local_method_keeps_models_on_clients(workdir):
    from fedmedbench.fl.engine import flower as engine

    spec = make_spec(workdir, "local", method="local", rounds=2)
    engine.run(spec, log=lambda m: None)
    states = sorted((Path(spec.run_dir) / "checkpoint" / "clients").glob("*/r*.pt"))
    assert len(states) == 4  # one newest state per client, older versions pruned
    # the server's global model never changed: it is the initial model
    fed.seed_everything(0)
    init = fed.new_model(fed.resolve_data_shapes(spec)).state_dict()
    final = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    assert all(torch.equal(init[k], final[k]) for k in init)
    rows = pd.read_csv(Path(spec.run_dir) / "client_metrics.csv")
    assert sorted(rows["client"].unique()) == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("method,extras,model", [("fedavg", set(), "cnn_small"), ("scaffold", {"extra.delta_c"}, "cnn_small"),
                                                ("gpaf", {"extra.labels"}, "gpaf_cnn")])
def test_only_parameters_and_declared_extras_leave_a_client(workdir, monkeypatch, method, extras, model):
    """Every reply of a real Flower run is recorded; only shared-model arrays, metrics and the
    method's declared extras may appear (the engine also enforces this on every reply)."""
    from fedmedbench.fl.engine import flower as engine

    seen = []
    original = engine.FlowerTransport.inspect

    def record(self, reply):
        seen.append((sorted(reply.content.array_records), sorted(reply.content.metric_records),
                     sorted(reply.content.config_records), sorted(reply.content["arrays"].keys())))
        original(self, reply)

    monkeypatch.setattr(engine.FlowerTransport, "inspect", record)
    spec = make_spec(workdir, f"msgs-{method}", method=method, rounds=2, model=model)
    engine.run(spec, log=lambda m: None)
    assert len(seen) == 2 * 4  # 2 rounds x 4 clients
    model_keys = sorted(fed.new_model(fed.resolve_data_shapes(spec)).state_dict())
    for arrays, metrics, configs, keys in seen:
        assert set(arrays) == {"arrays"} | extras
        assert metrics == ["metrics"] and configs == []
        if method == "gpaf":  # only encoder and classifier leave a GPAF client
            assert keys and all(k.startswith(("encoder.", "classifier.")) for k in keys), keys[:5]
            assert not any(k.startswith(("decoder.", "discriminator.", "generator.")) for k in keys)
        else:
            assert keys == model_keys

    bad = engine.AllowedContent(model_keys[:-1], ())
    from flwr.app import ArrayRecord, MetricRecord, RecordDict

    with pytest.raises(engine.ClientFailure, match="undeclared record"):
        bad.check(RecordDict({"metrics": MetricRecord({"a": 1.0}), "secret": ArrayRecord()}), 0)


def test_orphaned_ray_dirs_of_dead_jobs_are_removed(tmp_path):
    import os
    import subprocess

    from fedmedbench.fl.engine.flower import remove_orphaned_ray_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"fmb-ray-{dead.pid}-abc").mkdir()
    (tmp_path / f"fmb-ray-{os.getpid()}-def").mkdir()
    removed = remove_orphaned_ray_dirs(tmp_path)
    assert [p.name for p in removed] == [f"fmb-ray-{dead.pid}-abc"]
    assert (tmp_path / f"fmb-ray-{os.getpid()}-def").exists()


@pytest.fixture(scope="module")
def ray_run(workdir):
    """One job on the Ray backend (3 SCAFFOLD rounds, 3 clients a round), with what its processes listened on while
    its first round ran: read by the backend-equivalence and the loopback tests (one Ray start-up for both)."""
    pytest.importorskip("ray")
    import psutil

    from fedmedbench.fl.engine import flower as engine

    seen: list[set] = []
    train = engine.FlowerTransport.train

    def train_and_look(self, *args, **kwargs):
        if not seen:  # while the first round runs: Ray and its actors are up
            me = psutil.Process()
            seen.append(listening_addresses({me.pid} | {p.pid for p in me.children(recursive=True)}))
        return train(self, *args, **kwargs)

    spec = backend_spec(workdir, "ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine.FlowerTransport, "train", train_and_look)
        engine.run(spec, log=lambda m: None)
    return Path(spec.run_dir), seen[0]


def backend_spec(workdir: Path, backend: str) -> RunSpec:
    spec = make_spec(workdir, f"backend-{backend}", method="scaffold", rounds=3)
    spec.threads, spec.backend, spec.clients_per_round = 1, backend, 3
    return spec


@pytest.mark.slow
def test_inline_and_ray_backends_give_bit_identical_runs(workdir, ray_run):
    """The backend only changes how messages travel: same weights, same metrics."""
    from fedmedbench.fl.engine import flower as engine

    spec = backend_spec(workdir, "inline")
    engine.run(spec, log=lambda m: None)
    runs = {"inline": Path(spec.run_dir), "ray": ray_run[0]}
    a = torch.load(runs["inline"] / "model.pt", weights_only=True)
    b = torch.load(runs["ray"] / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma = pd.read_csv(runs["inline"] / "metrics.csv").drop(columns="elapsed_s")
    mb = pd.read_csv(runs["ray"] / "metrics.csv").drop(columns="elapsed_s")
    pd.testing.assert_frame_equal(ma, mb)


LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def listening_addresses(pids: set[int]) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket the processes ``pids`` listen on."""
    import psutil

    found = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.NoSuchProcess:
                continue
            found.add((conn.laddr.ip, conn.laddr.port, name))
    return found


@pytest.mark.slow
def test_ray_listens_on_the_loopback_address_only(ray_run):
    """Ray has no authentication: while a job runs, its GCS server, raylet, object manager, driver and actor
    listen on 127.0.0.1 only (Ray's default is every interface), and no dashboard is started."""
    seen = ray_run[1]
    names = {name for _, _, name in seen}
    assert {"gcs_server", "raylet"} <= names, seen  # Ray's own servers were found
    beyond = sorted((ip, port, name) for ip, port, name in seen if ip not in LOOPBACK)
    assert beyond == [], f"Ray ports listening beyond 127.0.0.1: {beyond}"
    assert not any("dashboard" in name for name in names)


def test_unknown_backend_is_named(workdir):
    from fedmedbench.fl.engine import flower as engine

    spec = make_spec(workdir, "badbackend")
    spec.backend = "grpc"
    with pytest.raises(ValueError, match="engine.backend = 'grpc'"):
        engine.run(spec, log=lambda m: None)


def test_inline_grid_delivers_like_flower(workdir):
    """Opaque node ids, a Context per node that persists, protobuf round trips, errors as replies."""
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp

    from fedmedbench.fl.engine.inline_grid import InlineGrid

    app = ClientApp()

    @app.query()
    def query(msg, context):
        calls = int(context.state.config_records.get("calls", ConfigRecord({"n": 0}))["n"]) + 1
        context.state["calls"] = ConfigRecord({"n": calls})
        if msg.content["config"]["fail"]:
            raise ValueError("boom on purpose")
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"info": ConfigRecord({"pid": pid, "calls": calls})}), reply_to=msg)

    grid = InlineGrid(app, num_nodes=3, seed=1, wire=True)
    nodes = list(grid.get_node_ids())
    assert len(set(nodes)) == 3 and not set(nodes) & {0, 1, 2}

    def ask(fail=False):
        msgs = [Message(RecordDict({"config": ConfigRecord({"fail": fail})}), dst_node_id=n,
                        message_type=MessageType.QUERY) for n in nodes]
        return list(grid.send_and_receive(msgs)), msgs

    replies, msgs = ask()
    assert [r.metadata.reply_to_message_id for r in replies] == [m.metadata.message_id for m in msgs]
    assert {r.metadata.src_node_id: int(r.content["info"]["pid"]) for r in replies} == dict(zip(nodes, range(3), strict=True))
    replies, _ = ask()
    assert all(int(r.content["info"]["calls"]) == 2 for r in replies)  # node state kept across messages
    replies, _ = ask(fail=True)
    assert all(r.has_error() and "boom on purpose" in r.error.reason for r in replies)
    with pytest.raises(ValueError, match="unknown node"):
        grid.push_messages([Message(RecordDict(), dst_node_id=12345, message_type=MessageType.QUERY)])


def test_client_metrics_from_the_shared_global_prediction_equal_direct_evaluation(workdir):
    """The server predicts the global test set once; each client's numbers come from its rows."""
    from fedmedbench.fl.tasks.classification import ClassificationTask
    from fedmedbench.fl.training import evaluate

    spec = fed.resolve_data_shapes(make_spec(workdir, "evalrows"))
    task = ClassificationTask(spec)
    torch.manual_seed(3)
    model = fed.new_model(spec)
    _, per_client = task.evaluate_global(model, torch.device("cpu"))
    assert all(r is not None for r in task._eval_cache["rows"])  # every client's test split is in the global set
    for pid in range(task.num_clients):
        c = task.data.client(pid)
        direct = evaluate(model, c.test_x, c.test_y, 64, torch.device("cpu"))
        for k, v in direct.items():
            np.testing.assert_allclose(per_client[pid][f"local_{k}"], v, rtol=1e-6, equal_nan=True)
