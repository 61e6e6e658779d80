"""The detection task (UltraFlwr) deployed: the sites' folders, a run through the deployed ServerApp/ClientApp
ending bit-identical to the simulation (heads never leave a site), runs over a live SuperLink under load, and a
hostile site refused. The segmentation task (FedST) deployed: tests/test_deployment_segmentation.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import surgical as S
from helpers.deploy_inline import run_inline
from helpers.deployment import Federation, kept_state, run_deployed, same_model

from fedmedbench.deploy.export import server_spec
from fedmedbench.deploy.site_data import export_sites, site_folder
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.detection import components as C

pytestmark = pytest.mark.slow
SITES = 2


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
    same_model(spec.run_dir, deployed.run_dir)
    for pid in range(SITES):
        sim, site = kept_state(spec.run_dir, pid)["model"], kept_state(d / "states" / f"site{pid}", pid)["model"]
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
    """YOLO payloads through a real SuperLink whose state is an SQLite file, on a loaded machine: the run ends with
    a model of the simulation's layout and no request failed on a locked database (a site's upload failed with
    "500 ... database is locked", the run failed and the next stayed pending; the hostile runs below are the runs
    that follow this one, each reaching its round's replies).
    Not checked here: the live model equals the simulation's only through the in-process deployment
    (``test_ultraflwr_deployed_matches_the_simulation_…``); over separate ClientApp processes it differs."""
    _, spec = detection
    fl, _ = detection_federation
    sim = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    one_round = RunSpec.from_dict({**server_spec(spec), "train": {**spec.train, "rounds": 1}})
    deployed, out = run_deployed(fl, one_round, "deployed", 900, attempts=1)
    assert (Path(deployed.run_dir) / "model.pt").is_file(), out.stdout[-4000:] + out.stderr[-2000:]
    model = torch.load(Path(deployed.run_dir) / "model.pt", weights_only=True)
    assert {k: v.shape for k, v in model.items()} == {k: v.shape for k, v in sim.items()}
    assert all(bool(v.isfinite().all()) for v in model.values() if v.is_floating_point())
    assert "database is locked" not in (fl.root / "superlink.log").read_text()


@pytest.mark.parametrize("mode,needle", [("nan", "holds NaN or inf"), ("shape", "has shape (1,), the server's model")])
def test_a_hostile_site_is_refused_over_a_live_superlink(detection, detection_federation, mode, needle):
    """Site 1 sends a NaN or a cut model array: round 1 fails naming client 1 and the array; no model is saved.
    Two rounds are asked for: a one-round UltraFlwr run's only reply carries no array (its final aggregation is
    omitted), so nothing hostile could be sent; the refusal ends the run after round 1's training. Each run follows
    another on the same SuperLink (the honest one above, then the refused NaN run): none is left pending and no
    request fails on a locked database."""
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
    assert "database is locked" not in (fl.root / "superlink.log").read_text()
