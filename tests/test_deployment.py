"""A real multi-site deployment on 127.0.0.1: SuperLink (TLS, SuperNode authentication) + one SuperNode per site.

Every process is started in its own session and killed by PID at the end. Ports are picked free
on the loopback interface; nothing else is contacted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from helpers import split_labels
from helpers.deployment import BIN, REPO, Federation, app_folder, run_deployed

from fedmedbench.data import synthetic
from fedmedbench.deploy import __main__ as deploy_cli
from fedmedbench.deploy import apps, credentials
from fedmedbench.deploy.export import export_run
from fedmedbench.deploy.site_data import SiteDataError, export_sites, load_site, site_folder
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io

SITES = 3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Synthetic BreastMNIST, a 3-site partition, the inline simulation's result and the sites' folders."""
    d = tmp_path_factory.mktemp("deploy")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 240, "val": 30, "test": 60})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "dirichlet", SITES, 0, {"alpha": 1.0},
                                                  num_classes=2))
    spec = RunSpec(run_dir=str(d / "sim"), study="t", dataset="breastmnist", setting="dir", method="fedavg", seed=0,
                   partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28,
                   train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9},
                   device="cpu", threads=1)
    engine.run(spec, log=lambda m: None)
    export_sites(spec, d / "sites", {"dataset": "breastmnist"})
    return d, spec


# ----------------------------------------------------------------------------- in-process checks


def _context(node_config, run_config=None) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config=run_config or {})


def test_site_folder_holds_exactly_its_partition(study):
    d, spec = study
    sim = fed.task_for(spec)
    for pid in range(SITES):
        mine, theirs = load_site(site_folder(d / "sites", pid), pid, spec).data, sim.client_data(pid)
        for part in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
            assert torch.equal(getattr(mine, part), getattr(theirs, part)), (pid, part)


def test_export_bundle_is_all_or_nothing_and_names_the_server_spec(study, tmp_path):
    _, spec = study
    out = tmp_path / "bundle"
    written = export_run(spec, out)
    assert sorted(p.name for p in out.iterdir()) == ["server", "site-00", "site-01", "site-02"]
    server = json.loads((out / "server" / "spec.json").read_text())
    assert written[-1] == out / "server" / "spec.json" and Path(server["run_dir"]).is_absolute()
    with pytest.raises(FileExistsError, match="bundle"):
        export_run(spec, out)
    broken = RunSpec.from_dict({**spec.to_dict(), "sources": {"base": str(tmp_path / "missing.npz")}})
    with pytest.raises(Exception, match="missing.npz"):
        export_run(broken, tmp_path / "other")
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".other.*"))


def _fab_names(files: dict[str, Path]) -> set[str]:
    """The files of the FAB ``flwr run`` builds from ``files`` (Flower's own filter: its patterns and .gitignore)."""
    import io as _io
    import zipfile

    from flwr.cli.build import build_fab_from_files

    fab, _ = build_fab_from_files(files)
    return {n for n in zipfile.ZipFile(_io.BytesIO(fab)).namelist() if not n.startswith(".info/")}


def test_the_app_the_tests_run_is_the_checkouts_app_code(tmp_path):
    """``flwr run .`` in a checkout (docs/deployment.md) packs pyproject.toml and the package; the tests' lean app
    folder (helpers/deployment.py: without the venv, which Flower would walk on every run) packs the same code."""
    if not (REPO / ".git").exists():
        pytest.skip("the checkout's files are listed by git: this tree is not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    checkout = _fab_names({p: REPO / p for p in tracked.stdout.split("\0") if p and (REPO / p).is_file()})
    package = {n for n in checkout if n.startswith("src/fedmedbench/")}
    assert "pyproject.toml" in checkout and "src/fedmedbench/deploy/apps.py" in package
    app = app_folder(tmp_path / "app")
    lean = _fab_names({p.relative_to(app).as_posix(): p for p in app.rglob("*") if p.is_file()})
    assert {n for n in lean if n.startswith("src/")} == package and "pyproject.toml" in lean


def test_credentials_command_writes_ca_server_and_site_keys(tmp_path, capsys):
    deploy_cli.main(["credentials", "--out", str(tmp_path), "--host", "127.0.0.1", "--host", "fl.example.org",
                     "--sites", "2"])
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "fl.example.org" in names.get_values_for_type(x509.DNSName)
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "keys" / "site01").stat().st_mode & 0o077 == 0
    assert (tmp_path / "keys" / "site01.pub").read_text().startswith("ecdsa-sha2-nistp384 ")


def test_site_refuses_wrong_or_corrupt_folder(study, tmp_path):
    d, spec = study
    with pytest.raises(SiteDataError, match="partition 0, but this SuperNode is partition-id=1"):
        load_site(site_folder(d / "sites", 0), 1, spec)
    bad = tmp_path / "site-00"
    bad.mkdir()
    for f in ("manifest.json", "data.npz"):
        (bad / f).write_bytes((site_folder(d / "sites", 0) / f).read_bytes())
    with (bad / "data.npz").open("r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01")
    with pytest.raises(SiteDataError, match="data.npz: SHA-256"):
        load_site(bad, 0, spec)


def test_site_refuses_data_paths_and_unknown_keys_from_the_server(study):
    d, spec = study
    node = {"partition-id": 0, "data-dir": str(site_folder(d / "sites", 0))}
    ok = apps.client_spec_json(fed.resolve_data_shapes(spec))
    assert apps.site_spec(ok, node).sources == {} and apps.site_spec(ok, node).partition_path == ""
    for key, value in [("sources", {"base": "/server/b.npz"}), ("partition_path", "/server/p.json"),
                       ("run_dir", "/server/run"), ("pretrained_path", "/server/w.pt")]:
        with pytest.raises(apps.SiteRefusal, match=key):
            apps.site_spec(json.dumps({**json.loads(ok), key: value}), node)
    with pytest.raises(apps.SiteRefusal, match="data-path"):
        apps.check_run_config({"server-spec-file": "x", "data-path": "/elsewhere"})
    with pytest.raises(apps.SiteRefusal, match="data-dir"):
        apps.site_spec(ok, {"partition-id": 0})
    with pytest.raises(apps.SiteRefusal, match="centralized"):
        apps.site_spec(json.dumps({**json.loads(ok), "method": "centralized"}), node)
    reads = {"mode": "reference", "domains": {}, "domain_seed": 0}  # the clean images are not in a site folder
    with pytest.raises(apps.SiteRefusal, match="client_augmentation"):
        apps.site_spec(json.dumps({**json.loads(ok), "client_augmentation": reads}), node)


def test_a_site_sends_only_arrays_and_metrics(study):
    d, spec = study
    spec = dataclasses.replace(fed.resolve_data_shapes(spec), client_validation="mean")
    node = {"partition-id": 1, "data-dir": str(site_folder(d / "sites", 1)), "state-dir": str(d / "state1")}
    ctx = _context(node, {"server-spec-file": "", "round-timeout-s": 5})
    hello = Message(RecordDict({"spec": ConfigRecord({"json": apps.client_spec_json(spec)})}), dst_node_id=1,
                    message_type=MessageType.QUERY)
    reply = apps.client_app(_as_received(hello), ctx)
    assert int(reply.content["info"]["partition-id"]) == 1
    arrays = {k: v.numpy() for k, v in fed.new_model(spec).state_dict().items()}
    rec = ArrayRecord({k: Array.from_numpy_ndarray(np.asarray(v)) for k, v in arrays.items()})
    msg = Message(RecordDict({"arrays": rec, "config": ConfigRecord({"round": 1, "steps": 2})}), dst_node_id=1,
                  message_type=MessageType.TRAIN)
    reply = apps.client_app(_as_received(msg), ctx)
    assert set(reply.content.array_records) == {"arrays"}
    assert set(reply.content.metric_records) == {"metrics"} and not reply.content.config_records
    assert set(reply.content["arrays"].keys()) == set(arrays)
    # scalars only: the loss of each local epoch and the site's own validation of its trained model (GPAF Fig. 5)
    assert {"train_loss", "train_loss_e1", "client_val_accuracy", "client_val_examples"} <= set(reply.content["metrics"])
    engine.AllowedContent(list(arrays), ()).check(reply.content, 1)  # what the server checks on every reply
    assert fed.site_data == {}  # the site's data stood in only while its messages were handled


def _as_received(msg: Message) -> Message:
    """A message as a ClientApp gets it (with the metadata the SuperNode fills in)."""
    msg.metadata.__dict__["_message_id"] = "m"
    return msg


# ----------------------------------------------------------------------------- a real deployment


@pytest.fixture(scope="module")
def deployment(study, tmp_path_factory):
    d, spec = study
    root = tmp_path_factory.mktemp("federation")
    fl = Federation(root)
    try:
        fl.superlink()
        keys = [fl.register(f"site{pid}") for pid in range(SITES)]
        nodes = [fl.supernode(f"site{pid}", key, f"partition-id={pid} data-dir='{site_folder(d / 'sites', pid)}' "
                              f"state-dir='{root / f'state{pid}'}'") for pid, key in enumerate(keys)]
        yield fl, nodes
    finally:
        fl.stop()


def test_three_sites_over_tls_match_the_simulation_bit_for_bit(study, deployment):
    _, spec = study
    fl, _ = deployment
    server_spec, out = run_deployed(fl, spec, "deployed", 240)
    model = Path(server_spec.run_dir) / "model.pt"
    assert model.is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    deployed = torch.load(model, weights_only=True)
    simulated = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    assert deployed.keys() == simulated.keys()
    for key in simulated:
        assert torch.equal(deployed[key], simulated[key]), key


def test_an_unregistered_site_is_refused(deployment):
    fl, _ = deployment
    key, _ = credentials.make_node_key(fl.root / "keys", "intruder")
    proc = fl.supernode("intruder", key, "partition-id=0", "--max-retries", "1")
    proc.wait(timeout=120)
    assert proc.returncode != 0
    assert "Failed to activate SuperNode" in (fl.root / "intruder.log").read_text()


def test_a_site_lost_mid_run_fails_the_round_then_the_run_resumes_bit_identical(study, deployment):
    """Kill one SuperNode after round 1: round 2 fails naming the missing reply; restarted, the run resumes from
    round 1's checkpoint and ends on the simulation's model (the study's two rounds)."""
    d, spec = study
    fl, nodes = deployment
    server_spec = RunSpec.from_dict({**spec.to_dict(), "run_dir": str(fl.root / "lost")})
    io.write_json(fl.root / "lost.json", server_spec.to_dict())
    args = [str(BIN / "flwr"), "run", str(fl.app), "hospitals", "--stream", "--run-config",
            f"server-spec-file='{fl.root / 'lost.json'}' round-timeout-s=45"]
    run = subprocess.Popen(args, env=fl.env, cwd=fl.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    fl.procs.append(run)
    ckpt = Path(server_spec.run_dir) / "checkpoint" / "server.pt"
    deadline = time.monotonic() + 240
    while not ckpt.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ckpt.exists(), "the deployed run never completed a round"
    os.killpg(nodes[2].pid, signal.SIGKILL)
    text, _ = run.communicate(timeout=300)
    assert not (Path(server_spec.run_dir) / "model.pt").exists()
    assert "expected 3 replies, got 2" in text or "client(s) failed" in text, text[-3000:]

    key = fl.root / "keys" / "site2"
    nodes[2] = fl.rejoin("site2-again", key, f"partition-id=2 data-dir='{site_folder(d / 'sites', 2)}' "
                         f"state-dir='{fl.root / 'state2'}'")
    again = fl.flwr(*args[1:-1], f"server-spec-file='{fl.root / 'lost.json'}' round-timeout-s=600", timeout=600)
    model = Path(server_spec.run_dir) / "model.pt"
    assert model.is_file(), again.stdout[-3000:]
    assert "resum" in again.stdout.lower(), again.stdout[-3000:]
    deployed = torch.load(model, weights_only=True)
    simulated = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    assert deployed.keys() == simulated.keys()
    for k in simulated:
        assert torch.equal(deployed[k], simulated[k]), k
