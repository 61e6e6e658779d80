"""The surgical tasks deployed: detection (UltraFlwr) and segmentation (FedST) site folders, runs
through the deployed ServerApp/ClientApp ending bit-identical to the simulation, and what a
personalized method's sites send (never their personal parameters)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from helpers import surgical as S
from helpers.deploy_inline import run_inline
from helpers.deployment import Federation, run_deployed
from test_fedst_fl import clips, make_spec, study_cfg  # noqa: F401  (clips: the synthetic clip export fixture)

from fedmedbench.deploy import apps
from fedmedbench.deploy.export import server_spec
from fedmedbench.deploy.site_data import SiteDataError, export_sites, load_site, site_folder
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.state.client_state import ClientStateStore
from fedmedbench.fl.tasks.detection import components as C

pytestmark = pytest.mark.slow
SITES = 2


def _same_model(a_dir, b_dir) -> None:
    a = torch.load(f"{a_dir}/model.pt", weights_only=True)
    b = torch.load(f"{b_dir}/model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _kept(run_dir, pid: int) -> dict:
    """A client's persistent state after the run (its own model or personal parameters)."""
    return ClientStateStore(checkpoint.checkpoint_dir(run_dir) / "clients").load(pid, before_round=10**6)


def _recording(monkeypatch) -> list[list[str]]:
    """Records the array keys of every training reply the server receives."""
    seen: list[list[str]] = []
    original = engine.FlowerTransport.inspect

    def record(self, reply):
        seen.append(sorted(reply.content["arrays"].keys()))
        original(self, reply)

    monkeypatch.setattr(engine.FlowerTransport, "inspect", record)
    return seen


# ----------------------------------------------------------------------------- detection (UltraFlwr)


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    """A 2-client YOLO setting, a 2-round FedBackboneNeckAvg simulation and the sites' folders."""
    d = tmp_path_factory.mktemp("deploy_det")
    manifest = S.yolo_setting(d / "data", SITES)
    spec = fed.resolve_data_shapes(RunSpec(
        run_dir=str(d / "sim"), study="ultraflwr", dataset="g", setting="a", method="ultraflwr", seed=0,
        partition_path=str(manifest), sources={}, image_size=64, model="yolo11n.yaml",
        train={"rounds": 2, "local_epochs": 1, "batch_size": 8, "lr": 0.01},
        method_params={"strategy": "FedBackboneNeckAvg"}, task="detection", device="cpu", threads=1, eval_every=2))
    engine.run(spec, log=lambda m: None)
    export_sites(spec, d / "sites", {"dataset": "g"})
    return d, spec


def test_detection_site_folder_is_the_clients_export_and_nothing_else(detection):
    d, spec = detection
    manifest = json.loads((site_folder(d / "sites", 1) / "manifest.json").read_text())
    src = json.loads(Path(spec.partition_path).read_text())["clients"][1]
    root = Path(src["data_yaml"]).parent
    exported = {f"{s}/{k}/{p.name}" for s in ("train", "val", "test") for k in ("images", "labels")
                for p in (root / s / k).iterdir()}
    assert set(manifest["files"]) == exported | {"data.yaml"}  # no other client's frames, no CD split
    assert manifest["task"] == "detection" and manifest["num_classes"] == spec.num_classes


def test_ultraflwr_deployed_matches_the_simulation_and_heads_never_leave(detection, monkeypatch):
    """Both sites end with the simulation's models bit for bit (aggregated backbone+neck, own head);
    every reply carries backbone+neck keys only (round 2: nothing, the final aggregation is omitted)."""
    d, spec = detection
    seen = _recording(monkeypatch)
    deployed = RunSpec.from_dict({**server_spec(spec), "run_dir": str(d / "deployed")})
    run_inline(deployed, d / "sites", d / "states", SITES)
    _same_model(spec.run_dir, deployed.run_dir)
    for pid in range(SITES):
        sim, site = _kept(spec.run_dir, pid)["model"], _kept(d / "states" / f"site{pid}", pid)["model"]
        assert sim.keys() == site.keys() and all(torch.equal(sim[k], site[k]) for k in sim), pid
    model = fed.new_model(spec)
    head = set(C.component_keys(model, "ultraflwr")["head"])
    shared = set(get_method(spec.method, spec.method_params).shared_keys(model))
    assert len(seen) == 2 * SITES
    assert [set(k) for k in seen[:SITES]] == [shared] * SITES and seen[SITES:] == [[]] * SITES
    assert not head & shared
    rows = json.loads((d / "deployed" / "summary.json").read_text())
    assert rows["rounds_run"] == 2
    import pandas as pd

    clients = pd.read_csv(d / "deployed" / "client_metrics.csv")
    sim_clients = pd.read_csv(f"{spec.run_dir}/client_metrics.csv")
    for pid in range(SITES):  # ID scores as in the simulation; CD needs other sites' frames: NaN at a site
        mine, ref = clients[clients.client == pid].iloc[-1], sim_clients[sim_clients.client == pid].iloc[-1]
        assert mine["local_map50"] == ref["local_map50"] and np.isnan(mine["cd_map50"])


@pytest.fixture(scope="module")
def detection_federation(detection, tmp_path_factory):
    """A SuperLink (TLS, SuperNode authentication, its state in a file as docs/deployment.md starts it) and one
    SuperNode per site; site 1's replies are edited as ``hostile.txt`` says (honest at first)."""
    d, _ = detection
    fl = Federation(tmp_path_factory.mktemp("det_federation"))
    mode = fl.root / "hostile.txt"
    mode.write_text("honest")
    try:
        fl.superlink()
        for pid in range(SITES):
            key = fl.register(f"site{pid}")
            fl.supernode(f"site{pid}", key, f"partition-id={pid} data-dir='{site_folder(d / 'sites', pid)}' "
                         f"state-dir='{fl.root / f'state{pid}'}'", env=fl.hostile_env(mode) if pid == 1 else None)
        yield fl, mode
    finally:
        fl.stop()


def test_ultraflwr_over_a_live_superlink_completes_under_load(detection, detection_federation):
    """YOLO payloads through a real SuperLink whose state is an SQLite file, two one-round runs in a row, on a loaded
    machine: both end with a model of the simulation's layout and no request failed on a locked database (a site's
    upload failed with "500 ... database is locked", the run failed and the next stayed pending).
    Not checked here: the live model equals the simulation's only through the in-process deployment
    (``test_ultraflwr_deployed_matches_the_simulation_…``); over separate ClientApp processes it differs."""
    _, spec = detection
    fl, _ = detection_federation
    sim = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    one_round = RunSpec.from_dict({**server_spec(spec), "train": {**spec.train, "rounds": 1}})
    for name in ("deployed", "again"):
        deployed, out = run_deployed(fl, one_round, name, 900, attempts=1)
        assert (Path(deployed.run_dir) / "model.pt").is_file(), out.stdout[-4000:] + out.stderr[-2000:]
        model = torch.load(Path(deployed.run_dir) / "model.pt", weights_only=True)
        assert {k: v.shape for k, v in model.items()} == {k: v.shape for k, v in sim.items()}
        assert all(bool(v.isfinite().all()) for v in model.values() if v.is_floating_point())
    assert "database is locked" not in (fl.root / "superlink.log").read_text()


@pytest.mark.parametrize("mode,needle", [("nan", "holds NaN or inf"), ("shape", "has shape (1,), the server's model")])
def test_a_hostile_site_is_refused_over_a_live_superlink(detection, detection_federation, mode, needle):
    """Site 1 sends a NaN or a cut model array: round 1 fails naming client 1 and the array; no model is saved.
    Two rounds are asked for: a one-round UltraFlwr run's only reply carries no array (its final aggregation is
    omitted), so nothing hostile could be sent; the refusal ends the run after round 1's training."""
    _, spec = detection
    fl, mode_file = detection_federation
    mode_file.write_text(mode)
    two_rounds = RunSpec.from_dict({**server_spec(spec), "train": {**spec.train, "rounds": 2}})
    try:
        deployed, out = run_deployed(fl, two_rounds, f"hostile-{mode}", 900, attempts=1)
    finally:
        mode_file.write_text("honest")
    text = out.stdout + out.stderr
    assert re.search(rf"round 1: client 1 sent a reply the server refuses: model arrays '[^']+' {re.escape(needle)}", text), \
        text[-4000:]
    assert not (Path(deployed.run_dir) / "model.pt").exists()


# ----------------------------------------------------------------------------- segmentation (FedST)


@pytest.fixture(scope="module")
def segmentation(clips, tmp_path_factory):  # noqa: F811
    """FedST (with SERQ) on 2 synthetic sites for 1 round: simulation and the sites' folders."""
    d = tmp_path_factory.mktemp("deploy_seg")
    cfg = study_cfg(train={**study_cfg()["train"], "rounds": 1})
    spec = make_spec(clips, d, "fedst", cfg=cfg)
    engine.run(spec, log=lambda m: None)
    export_sites(spec, d / "sites", {"dataset": "synthetic"})
    return d, spec, cfg


@pytest.fixture(scope="module")
def federation(segmentation, tmp_path_factory):
    """A SuperLink with TLS and SuperNode authentication, and one SuperNode per site (real processes)."""
    d, _, _ = segmentation
    fl = Federation(tmp_path_factory.mktemp("seg_federation"))
    try:
        fl.superlink()
        for pid in range(SITES):
            key = fl.register(f"site{pid}")
            fl.supernode(f"site{pid}", key, f"partition-id={pid} data-dir='{site_folder(d / 'sites', pid)}' "
                         f"state-dir='{fl.root / f'state{pid}'}'")
        yield fl
    finally:
        fl.stop()


def test_fedst_over_tls_matches_the_simulation_and_personal_parameters_stay(segmentation, federation):
    """FedST with SERQ through a real SuperLink and two SuperNodes: the global model and each site's
    personal parameters (kept at the site) are the simulation's, bit for bit. On a loaded machine it failed
    while Flower's SuperLink stored payloads in its SQLite file ("500 ... database is locked", the SuperNodes
    exited); the sites now start through ``python -m fedmedbench.deploy`` (``compat.patch_flower_deployment``)."""
    d, spec, _ = segmentation
    fl = federation
    # a round's limit counts until each reply message is in (not its payload's transfer): ~145 s under a load
    # average of 13-20 on 2 cores, against 240 s before; a round past it ends the run ("push-object 403 Run is finished")
    deployed, out = run_deployed(fl, RunSpec.from_dict(server_spec(spec)), "deployed", 600)
    assert (Path(deployed.run_dir) / "model.pt").is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    _same_model(spec.run_dir, deployed.run_dir)
    personal = set(get_method(spec.method, spec.method_params).personal(fed.new_model(spec)))
    for pid in range(SITES):
        sim, site = _kept(spec.run_dir, pid)["personal"], _kept(fl.root / f"state{pid}", pid)["personal"]
        assert set(site) == personal and all(torch.equal(sim[k], site[k]) for k in sim), pid


def test_segmentation_site_folder_holds_the_sites_clips(segmentation):
    d, spec, _ = segmentation
    sim = fed.task_for(spec).client_data(1)
    site = load_site(site_folder(d / "sites", 1), 1, apps.site_spec(
        apps.client_spec_json(spec), {"partition-id": 1, "data-dir": str(site_folder(d / "sites", 1))})).data
    assert site.site == sim.site == "B" and torch.equal(site.indicator, sim.indicator)
    for split in ("train", "test"):
        mine, ref = getattr(site, split), getattr(sim, split)
        assert len(mine) == len(ref)
        for i in range(len(ref)):
            assert all(torch.equal(a, b) for a, b in zip(mine.item(i), ref.item(i), strict=True)), (split, i)


def test_a_site_gets_no_server_path_and_refuses_one(segmentation):
    d, spec, _ = segmentation
    node = {"partition-id": 0, "data-dir": str(site_folder(d / "sites", 0))}
    sent = json.loads(apps.client_spec_json(spec))
    assert sent["task_params"]["clips_root"] is None and sent["method_params"]["serq"]["clips_root"] is None
    assert spec.task_params["clips_root"] and spec.method_params["serq"]["clips_root"]
    with pytest.raises(apps.SiteRefusal, match="task_params.clips_root"):
        apps.site_spec(json.dumps({**sent, "task_params": {**sent["task_params"], "clips_root": "/server/clips"}}), node)
    with pytest.raises(apps.SiteRefusal, match="'pretrained_path' file with SHA-256"):  # the site has no such model file
        apps.site_spec(json.dumps(sent), node, {"pretrained_path": "0" * 64})


def test_a_site_refuses_a_corrupt_or_swapped_surgical_folder(segmentation, tmp_path):
    import shutil

    d, spec, _ = segmentation
    site_spec = apps.site_spec(apps.client_spec_json(spec), {"partition-id": 0, "data-dir": str(site_folder(d / "sites", 0))})
    with pytest.raises(SiteDataError, match="partition 1, but this SuperNode is partition-id=0"):
        load_site(site_folder(d / "sites", 1), 0, site_spec)
    bad = tmp_path / "site-00"
    shutil.copytree(site_folder(d / "sites", 0), bad)
    frame = sorted((bad / "frames").iterdir())[3]
    with frame.open("r+b") as fh:
        fh.seek(60)
        fh.write(b"\xff\x00")
    with pytest.raises(SiteDataError, match=f"{frame.name}: SHA-256"):
        load_site(bad, 0, site_spec)
    shutil.copyfile(site_folder(d / "sites", 0) / "frames" / frame.name, frame)
    load_site(bad, 0, site_spec)  # restored: accepted
    (bad / "masks" / "extra.png").write_bytes(b"x")
    with pytest.raises(SiteDataError, match="extra.png: file not listed"):
        load_site(bad, 0, site_spec)
    with pytest.raises(SiteDataError, match="holds segmentation data, the server's run is a detection run"):
        load_site(site_folder(d / "sites", 0), 0, RunSpec.from_dict({**site_spec.to_dict(), "task": "detection"}))


@pytest.mark.parametrize("method", ["fedst", "fedrep", "feddp", "fedld", "fedas"])
def test_what_a_site_sends_is_exactly_the_shared_parts(segmentation, clips, tmp_path, method):  # noqa: F811
    """One training message to a deployed site per method: the reply holds the method's shared keys
    only (never a personal one) and passes the server's check; a personal key added is refused."""
    d, _, _ = segmentation
    spec = make_spec(clips, tmp_path, method)  # 2 rounds: FedDP's calibration round comes after a federated one
    server = RunSpec.from_dict(server_spec(spec))
    node = {"partition-id": 0, "data-dir": str(site_folder(d / "sites", 0)), "state-dir": str(tmp_path / "state")}
    ctx = apps_context(node)
    hello = Message(RecordDict({"spec": ConfigRecord({"json": apps.client_spec_json(server),
                                                      "model-files": json.dumps(apps.model_file_hashes(server))})}),
                    dst_node_id=1, message_type=MessageType.QUERY)
    apps.client_app(_as_received(hello), ctx)
    m = get_method(spec.method, spec.method_params)
    model = fed.new_model(spec)
    shared, personal = m.shared_keys(model), set(m.personal(model)) if hasattr(m, "personal") else set()
    state = model.state_dict()
    rec = ArrayRecord({k: Array.from_numpy_ndarray(state[k].numpy()) for k in shared})
    msg = Message(RecordDict({"arrays": rec, "config": ConfigRecord({"round": 1, "steps": 1})}), dst_node_id=1,
                  message_type=MessageType.TRAIN)
    reply = apps.client_app(_as_received(msg), ctx)
    sent = set(reply.content["arrays"].keys())
    assert sent <= set(shared) and not sent & personal
    if method != "feddp":
        assert sent == set(shared)
    allowed = engine.AllowedContent(shared, m.extra_records)
    allowed.check(reply.content, 0)
    if personal:
        leaked = next(iter(personal))
        reply.content["arrays"][leaked] = Array.from_numpy_ndarray(state[leaked].numpy())
        with pytest.raises(engine.ClientFailure, match="outside the shared model"):
            allowed.check(reply.content, 0)


def apps_context(node):
    from flwr.app import Context

    return Context(run_id=1, node_id=1, node_config=node, state=RecordDict(),
                   run_config={"server-spec-file": "", "round-timeout-s": 5})


def _as_received(msg: Message) -> Message:
    msg.metadata.__dict__["_message_id"] = "m"
    return msg
