"""The segmentation task (FedST) deployed: the sites' folders, a FedST run through a real SuperLink and SuperNodes
ending bit-identical to the simulation with each site's personal parameters kept at the site, and what a
personalized method's site sends (never its personal parameters). The detection task: test_deployment_surgical.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from helpers.deployment import Federation, kept_state, run_deployed, same_model
from test_fedst_fl import clips, make_spec, study_cfg  # noqa: F401  (clips: the synthetic clip export fixture)

from fedmedbench.deploy import apps
from fedmedbench.deploy.export import server_spec
from fedmedbench.deploy.site_data import SiteDataError, export_sites, load_site, site_folder
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec

pytestmark = pytest.mark.slow
SITES = 2


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
    same_model(spec.run_dir, deployed.run_dir)
    personal = set(get_method(spec.method, spec.method_params).personal(fed.new_model(spec)))
    for pid in range(SITES):
        sim, site = kept_state(spec.run_dir, pid)["personal"], kept_state(fl.root / f"state{pid}", pid)["personal"]
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
