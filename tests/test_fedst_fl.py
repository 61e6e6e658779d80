"""FedST study on the FL engine: personal parameters never leave their site, shared ones
are averaged, clips carry exactly their configured frames, FedLD/FedAS server rules, CLIP indicators."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import fedmedbench  # noqa: F401
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine.job import Job
from fedmedbench.fl.spec import RunSpec
from fedmedbench.studies.fedst import deploy
from fedmedbench.studies.fedst import runs as FS

SITES = {"A": "federated", "B": "federated", "E": "out_of_federation", "sim": "server"}


def _write_site(root: Path, site: str, role: str, rng: np.random.Generator) -> None:
    rows = []
    splits = ["test"] * 2 if role == "out_of_federation" else ["train"] * 4 + ["test"] * 2
    for i, split in enumerate(splits):
        frames = []
        for t in range(4):
            p = root / "raw" / site / f"c{i}_f{t}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(p)
            frames.append(str(p))
        mask = np.zeros((64, 64), dtype=np.uint8)
        mask[10:30, 10 + i:20 + i] = 1
        mask[30:40, 20:30] = 2
        mask[40:50, 20:30] = 3
        mp = root / "raw" / site / f"c{i}_mask.png"
        Image.fromarray(mask).save(mp)
        rows.append({"site": site, "dataset": site, "split": split, "video_id": "v", "frame": i, "timestamp_s": i * 0.2,
                     "clip_paths": frames, "clip_offsets_s": [-0.6, -0.4, -0.2, 0.0], "n_duplicated": 0, "mask_path": str(mp)})
    (root / site).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(root / site / "clips.parquet")


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fedst_clips")
    rng = np.random.default_rng(0)
    meta = {"sites": {}}
    for s, role in SITES.items():
        _write_site(root, s, role, rng)
        meta["sites"][s] = {"site": s, "role": role, "prompt": f"This is the Local site {s} model and the surgery type is x",
                            "label_set": "parts", "classes": ["background", "shaft", "wrist", "clasper"]}
    (root / "sites.json").write_text(json.dumps(meta))
    return root


def study_cfg(**over):
    cfg = {
        "sites": ["A", "B"], "outfed_site": "E", "unseen_site": "E", "server_site": "sim", "seeds": [0],
        "methods": list(FS.METHODS), "variants": [],
        "model": {"encoder": "pvt_v2_b0", "window": 2, "pools": [2, 1, 1, 1], "fields": [4, 3, 2, 2], "heads": 1,
                  "indicator_dim": 8, "decoder": "light", "temporal_at": "encoder", "decoder_dim": 16, "decoder_heads": 1},
        "indicator": {"kind": "onehot", "clip_weights": None, "clip_model": "ViT-B-32", "sigma": 0.1},
        "train": {"rounds": 2, "local_epochs": 0.5, "batch_size": 2, "lr": 1e-3, "optimizer": "adamw", "aggregation": "uniform"},
        "loss": {"dice_weight": 0.3, "augment": True, "rotate_deg": 15, "scale": 0.1},
        "pretrain": {"enabled": True, "steps": 1, "lr": 1e-4},
        "serq": {"steps": 1, "lr": 1e-4, "lambda2": 0.3, "lambda3": 0.3, "mu": 0.5, "probe": 2, "batch_size": 2},
        # what FedST sends: Table V's reading (the decoder shared, RSC kept), which most tests here inspect
        "method_params": {}, "sent": "table_v", "rsc_communicated": False, "data": {"input_size": [32, 32], "cache_mb": 64},
        "eval": {"eval_every": 2, "cross_site_eval": False, "batch_size": 4, "fps_clips": 1},
    }
    cfg.update(over)
    return cfg


def make_spec(clips: Path, tmp: Path, method: str, variant: str = "main", cfg=None) -> RunSpec:
    cfg = cfg or study_cfg()
    d = FS.run_spec(cfg, variant, method, 0, str(clips), str(tmp / f"{variant}-{method}"), None, "cpu", 1, "synthetic")
    return fed.resolve_data_shapes(RunSpec.from_dict(d))


class Recorder(fed.InProcessTransport):
    """Keeps every client reply (what would travel over Flower) for inspection."""

    def __init__(self, spec):
        super().__init__(spec)
        self.replies = []

    def train(self, rnd, steps, arrays, broadcast):
        out = super().train(rnd, steps, arrays, broadcast)
        self.replies.append((rnd, arrays, out))
        return out


def test_clips_carry_exactly_their_configured_frames(clips):
    from fedmedbench.fl.tasks.segmentation import load_clipset

    cs = load_clipset(clips, "A", "train", 4)
    x, y = cs.batch([1])
    df = pd.read_parquet(clips / "A" / "clips.parquet").sort_values(["video_id", "frame"])
    paths = list(df[df["split"] == "train"]["clip_paths"].iloc[1])
    assert x.shape == (1, 4, 3, 64, 64) and y.shape == (1, 64, 64)
    for t, p in enumerate(paths):  # frame t of the tensor is the t-th listed file, oldest .. current
        assert torch.equal(x[0, t], torch.from_numpy(np.asarray(Image.open(p).convert("RGB"))).permute(2, 0, 1))
    with pytest.raises(ValueError, match="configured for 3"):
        load_clipset(clips, "A", "train", 3)


def test_fedst_on_feddps_network_sends_the_encoder_without_queries_and_rsc_and_repeats_bit_for_bit(clips, tmp_path):
    """The default network (FPN decoder, encoder stochastic depth 0.1, RSC on the encoder's 1/8 map) and protocol
    (``sent: table_ix``): the replies carry the encoder without its queries and RSC; queries, selection, decoder and
    head stay; two runs of the same spec give the same bits (the decoder's dropout and the encoder's drop path draw
    from the site's generator)."""
    cfg = study_cfg(sent="table_ix", rsc_communicated=True,
                    model={**study_cfg()["model"], "decoder": "fpn", "temporal_at": "encoder", "heads": 2})
    spec = make_spec(clips, tmp_path, "fedst", "abl_ts_cs", cfg)
    method = get_method(spec.method, spec.method_params)
    model = fed.new_model(spec)
    params = {n for n, _ in model.named_parameters()}
    sent = {n for n in params if n.startswith("rsc.") or (n.startswith("encoder.") and ".attn.q." not in n)}
    assert model.rsc.dim == 64 and {"decoder.p5.weight", "decoder.head.weight"} <= params
    assert model.encoder.drop_paths() and model.cfg.drop_path_rate == 0.1
    assert set(method.shared_keys(model)) == sent  # GroupNorm / LayerNorm: no buffers
    runs = []
    for i in range(2):
        spec_i = make_spec(clips, tmp_path / f"run{i}", "fedst", "abl_ts_cs", cfg)
        transport = Recorder(spec_i)
        runs.append(fed.Federation(spec_i, log=lambda m: None).run(transport).arrays)
        assert all(set(r.arrays) == sent for _, _, out in transport.replies for r in out.values())
    assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_fedst_keeps_query_embeddings_and_selection_on_site_and_averages_the_rest(clips, tmp_path):
    cfg = study_cfg()
    cfg["serq"] = {**cfg["serq"]}
    spec = make_spec(clips, tmp_path, "fedst", "abl_ts_cs", cfg)  # SERQ off: the server step is the plain mean
    method = get_method(spec.method, spec.method_params)
    model = fed.new_model(spec)
    personal = set(method.personal(model))
    assert any(".attn.q." in k for k in personal) and any(k.startswith("cs.") for k in personal)
    assert any(k.startswith("rsc.") for k in personal)  # Sec. IV-D2: the temporal module is not communicated
    assert not any(".attn.kv." in k or k.startswith("decoder.") for k in personal)
    transport = Recorder(spec)
    state = fed.Federation(spec, log=lambda m: None).run(transport)
    shared = set(method.shared_keys(model))
    for _rnd, sent, results in transport.replies:
        assert set(sent) == shared  # the broadcast carries no personal entry either
        for r in results.values():
            assert set(r.arrays) == shared and not personal & set(r.arrays)
    # shared entries: the new global model is the uniform mean of what the sites sent
    _, _, last = transport.replies[-1]
    for k in ("encoder.backbone.stages.3.blocks.0.attn.kv.k.weight", "decoder.head.weight"):
        assert np.allclose(state.arrays[k], (last[0].arrays[k] + last[1].arrays[k]) / 2, atol=1e-6)
    # personal entries: different on the two sites, stored only in each site's own state
    from fedmedbench.fl.state import checkpoint
    from fedmedbench.fl.state.client_state import ClientStateStore

    store = ClientStateStore(checkpoint.checkpoint_dir(spec.run_dir) / "clients")
    s0, s1 = (store.load(p, before_round=99)["personal"] for p in (0, 1))
    assert set(s0) == personal
    q = "encoder.backbone.stages.0.blocks.0.attn.q.weight"
    assert not torch.equal(s0[q], s1[q])
    assert not torch.equal(s0["cs.indicator"], s1["cs.indicator"])
    # the deployed model (site E) averages the personal parameters after training
    dep = deploy.deployed_model(spec, method, state.arrays, [4, 4])
    assert torch.allclose(dep.state_dict()[q], (s0[q] + s1[q]) / 2)


def test_fedst_with_serq_updates_its_server_state_and_broadcasts_shared_only(clips, tmp_path):
    spec = make_spec(clips, tmp_path, "fedst")
    transport = Recorder(spec)
    state = fed.Federation(spec, log=lambda m: None).run(transport)
    assert {"serq_pre", "serq_D", "serq_Fg"} <= set(state.server_state)
    _, _, last = transport.replies[-1]
    mean = (last[0].arrays["decoder.head.weight"] + last[1].arrays["decoder.head.weight"]) / 2
    assert not np.allclose(state.arrays["decoder.head.weight"], mean)  # SERQ moved the averaged model (Eq. 12)
    for k in ("decoder.fuse.1.running_mean", "decoder.fuse.1.running_var"):  # Eq. 12 keeps the sites' BN statistics
        assert np.allclose(state.arrays[k], (last[0].arrays[k] + last[1].arrays[k]) / 2, atol=1e-6)
    assert not any(".attn.q." in k for k in state.arrays if k.startswith("encoder."))
    out = deploy.deploy_eval(spec, state, "E", "E", 1)
    assert 0.0 <= out["outfed_dice"] <= 1.0 and "unseen_dice_instrument" in out
    assert out["comm_mb_per_round"] > 0


def test_a_run_with_clips_decoded_ahead_in_threads_is_the_run_without(clips, tmp_path):
    """engine.loader_workers (not hashed): the sites' steps, SERQ's synthetic batches and the evaluation read
    their clips in 3 threads, ahead of use; engine.image_cache (not hashed) keeps them decoded on disk, written by
    one run and read by the next: weights and metric rows are the same bits as reading on demand."""
    from dataclasses import replace

    from fedmedbench.fl.methods import fedst as fedst_method

    runs = []
    store = tmp_path / "store"
    for workers, cache in ((0, None), (3, None), (0, str(store)), (2, str(store))):  # the store: written, then read
        spec = replace(make_spec(clips, tmp_path / f"{workers}-{bool(cache)}", "fedst"), loader_workers=workers,
                       image_cache=cache)
        fedst_method._SERVER_CLIPS.clear()
        state = fed.Federation(spec, log=lambda m: None).run(fed.InProcessTransport(spec))
        runs.append((state, state.rows + state.client_rows))
        if workers == 3:
            assert fedst_method._SERVER_CLIPS and all(c.cache.workers == 3 for c in fedst_method._SERVER_CLIPS.values())
    # engine.image_cache: the sites' and SERQ's clips kept decoded on disk for every job
    assert all(c.cache.store.folder == store for c in fedst_method._SERVER_CLIPS.values())
    assert len(list(store.rglob("*.npz"))) > sum(len(c) for c in fedst_method._SERVER_CLIPS.values())  # sites' too
    a, rows_a = runs[0]

    def numbers(rows):  # every column but the wall clock (NaN == NaN as text)
        return json.dumps([{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows])

    for b, rows_b in runs[1:]:
        assert set(a.arrays) == set(b.arrays) and all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
        assert numbers(rows_a) == numbers(rows_b) and any("local_dice" in r for r in rows_a)
    spec = make_spec(clips, tmp_path, "fedst")
    assert spec.run_hash() == replace(spec, loader_workers=3, image_cache=str(store)).run_hash()


def test_local_train_sends_nothing_and_fedavg_sends_everything(clips, tmp_path):
    spec = make_spec(clips, tmp_path, "seg_local")
    transport = Recorder(spec)
    fed.Federation(spec, log=lambda m: None).run(transport)
    assert all(r.arrays == {} for _, _, res in transport.replies for r in res.values())
    assert deploy.communication_mb(get_method("seg_local"), fed.new_model(spec)) == 0.0
    spec = make_spec(clips, tmp_path, "seg_fedavg")
    model = fed.new_model(spec)
    assert set(get_method("seg_fedavg").shared_keys(model)) == set(model.state_dict()) - {"cs.indicator"}


@pytest.mark.slow
def test_personal_parameters_never_leave_a_site_over_flower(clips, tmp_path, monkeypatch):
    """A real Flower run: every reply is recorded; no personal key is in any message."""
    from fedmedbench.fl.engine import flower as engine

    seen = []
    original = engine.FlowerTransport.inspect

    def record(self, reply):
        seen.append(sorted(reply.content["arrays"].keys()))
        original(self, reply)

    monkeypatch.setattr(engine.FlowerTransport, "inspect", record)
    cfg = study_cfg(train={**study_cfg()["train"], "rounds": 1})
    spec = make_spec(clips, tmp_path, "fedst", cfg=cfg)  # FedST with SERQ
    engine.run(spec, log=lambda m: None)
    method = get_method(spec.method, spec.method_params)
    model = fed.new_model(spec)
    personal, shared = set(method.personal(model)), set(method.shared_keys(model))
    assert len(seen) == 2  # 1 round x 2 sites
    for keys in seen:
        assert set(keys) == shared and not personal & set(keys)
    assert any(".attn.q." in k for k in personal) and "cs.fc.weight" in personal


def test_fedld_principal_aggregation_on_hand_made_updates():
    from fedmedbench.fl.methods.fedld import margin_loss, principal_layer_update

    # two directions; three clients along +e1 (two) and -e1 (one), all with a small e2 part
    g = np.array([[2.0, 0.1], [1.0, 0.1], [-1.0, 0.1]])
    upd = principal_layer_update(g, k_proportion=0.8)  # k = floor(0.8 * 3) = 2 directions
    h = g @ g.T / 3
    e, s, _ = np.linalg.svd(h)
    w = (g.T @ e[:, :2]).T
    for j in range(2):
        if (g @ w[j] >= 0).sum() < (g @ w[j] < 0).sum():
            w[j] = -w[j]
    expect = np.zeros(2)
    for i in range(3):
        for j in range(2):
            proj = (g[i] @ w[j]) / (w[j] @ w[j]) * w[j]
            expect += proj * s[j] / s.sum() * np.linalg.norm(g[i]) / np.linalg.norm(proj)
    assert np.allclose(upd, expect / 3)
    assert upd[0] > 0  # the majority direction (+e1) wins after sign alignment
    # each client's revised update keeps its norm split by the singular values: |comp_j| = s_j / sum(s) * |g_i|
    one = principal_layer_update(g[:1].repeat(2, 0), 0.5)  # k = 1: both clients identical
    assert np.allclose(np.linalg.norm(one), np.linalg.norm(g[0]) * 1.0)  # s_2 = 0: all weight on direction 1
    assert np.allclose(principal_layer_update(np.array([[1.0], [3.0]]), 0.8), [2.0])  # one-element layers: the mean
    # the margin term: 0.03 * log(1 + ||softmax||^2) over the whole batch
    logits = torch.zeros(1, 2, 1, 2)  # 2 pixels, 2 classes, softmax 0.5 everywhere: ||.||^2 = 4 * 0.25 = 1
    assert float(margin_loss(logits, 0.03)) == pytest.approx(0.03 * np.log(2.0))


def test_fedld_round_one_is_the_plain_mean():
    from fedmedbench.fl.api import ClientResult, ServerContext, TrainConfig

    method = get_method("fedld", {})
    glob = {"w": torch.zeros(2), "n": torch.tensor(3)}
    res = [ClientResult(arrays={"w": torch.tensor(v), "n": torch.tensor(3)}, num_examples=n)
           for v, n in (([1.0, 0.0], 1), ([3.0, 3.0], 3), ([-1.0, 0.0], 1))]
    tc = TrainConfig(rounds=2, local_epochs=1, batch_size=1, lr=0.1, aggregation="uniform")
    ctx = ServerContext(rnd=1, global_arrays=glob, results=res, pids=[0, 1, 2], state={}, num_clients=3,
                        device=torch.device("cpu"), train=tc, new_model=lambda: None)
    out = method.aggregate(ctx)
    assert np.allclose(out["w"], [1.0, 1.0]) and int(out["n"]) == 3  # uniform mean, not by examples
    ctx.rnd = 2
    out2 = method.aggregate(ctx)
    from fedmedbench.fl.methods.fedld import principal_layer_update

    g = np.array([[1.0, 0.0], [3.0, 3.0], [-1.0, 0.0]])
    assert np.allclose(out2["w"], principal_layer_update(g, 0.8), atol=1e-6)  # from round 2 on: the SVD step
    assert not np.allclose(out2["w"], [1.0, 1.0])


def test_fedas_weights_clients_by_fisher_trace():
    from fedmedbench.fl.api import ClientResult, ServerContext, TrainConfig

    a = {"w": np.zeros(3, dtype=np.float32), "bn.running_mean": np.zeros(2, dtype=np.float32)}
    b = {"w": np.ones(3, dtype=np.float32), "bn.running_mean": np.ones(2, dtype=np.float32)}
    ctx = ServerContext(rnd=1, global_arrays=a, results=[ClientResult(a, 100, {"fisher_trace": 1.0}),
                                                          ClientResult(b, 1, {"fisher_trace": 3.0})],
                        pids=[0, 1], state={}, num_clients=2, device=torch.device("cpu"),
                        train=TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1), new_model=lambda: None)
    out = get_method("fedas").aggregate(ctx)
    assert np.allclose(out["w"], 0.75)  # 3/4 of the weight, not by examples
    assert np.allclose(out["bn.running_mean"], 0.75)  # BN buffers by the same weights (the reference: first model's)


@pytest.mark.parametrize("evaluate", ["trained", "aggregate"])
def test_fedas_evaluates_each_sites_trained_model_aggregate_as_option(clips, tmp_path, evaluate):
    """The reference tests each client's own model, the one its local training left
    (``serveras.py:73-79``, ``clientbase.py:82-100``); ``evaluate: aggregate`` = the Fisher
    average + the site's classifier."""
    params = {} if evaluate == "trained" else {"fedas": {"evaluate": evaluate}}  # trained: the default
    cfg = study_cfg(train={**study_cfg()["train"], "rounds": 1}, method_params=params)
    spec = make_spec(clips, tmp_path, "fedas", cfg=cfg)
    transport = Recorder(spec)
    task, seen = transport.job.task, {}
    original = task.evaluate_client

    def capture(model, data, device):
        seen[len(seen)] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return original(model, data, device)

    task.evaluate_client = capture
    state = fed.Federation(spec, log=lambda m: None).run(transport)
    _, _, sent = transport.replies[-1]
    assert sorted(seen) == [0, 1]
    for pid in (0, 1):
        trained = sent[pid].arrays  # the shared part as the site's local training left it
        assert not np.allclose(trained["decoder.fuse.0.weight"], state.arrays["decoder.fuse.0.weight"])
        want = trained if evaluate == "trained" else state.arrays
        for k in ("decoder.fuse.0.weight", "encoder.backbone.stages.0.blocks.0.attn.kv.k.weight"):
            assert np.array_equal(seen[pid][k].numpy(), np.asarray(want[k])), (pid, k)
    assert get_method("fedas", {}).p["evaluate"] == "trained"
    with pytest.raises(ValueError, match="evaluate"):
        get_method("fedas", {"evaluate": "aligned"})


def test_indicators(clips, tmp_path):
    from fedmedbench.fl.tasks.segmentation import load_sites, site_indicators

    sites = load_sites(clips)["sites"]
    one = site_indicators(sites, {"kind": "onehot", "dim": 8})
    assert torch.equal(one["B"], torch.nn.functional.one_hot(torch.tensor(1), 8).float())
    gauss = site_indicators(sites, {"kind": "gaussian", "dim": 8, "sigma": 0.1})
    # the paper's formula exp(-(x - mu)^2 / (2 sigma^2)), x = dimension index, mu = site id (B = 1)
    assert gauss["B"][1] == 1.0 and gauss["B"][0] == pytest.approx(np.exp(-50.0), rel=1e-5)
    wide = site_indicators(sites, {"kind": "gaussian", "dim": 8, "sigma": 1.0})["B"]
    assert torch.allclose(wide, torch.exp(-((torch.arange(8.0) - 1) ** 2) / 2))
    with pytest.raises(ValueError, match="clip_weights"):
        site_indicators(sites, {"kind": "clip", "dim": 512})
    with pytest.raises(FileNotFoundError, match="clip_weights"):
        site_indicators(sites, {"kind": "clip", "dim": 512, "clip_weights": str(tmp_path / "none.pt")})


@pytest.mark.slow
def test_clip_indicator_from_a_local_weights_file(clips, tmp_path):
    """The CLIP path with a randomly initialised open_clip model saved as the 'local file'."""
    import open_clip

    from fedmedbench.fl.tasks.segmentation import load_sites, site_indicators

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", pretrained=None)
    path = tmp_path / "clip.pt"
    torch.save(model.state_dict(), path)
    sites = load_sites(clips)["sites"]
    emb = site_indicators(sites, {"kind": "clip", "dim": 512, "clip_weights": str(path), "clip_model": "ViT-B-32"})
    assert set(emb) == set(sites) and all(abs(float(v.norm()) - 1) < 1e-5 for v in emb.values())
    assert not torch.allclose(emb["A"], emb["B"])  # different prompts, different indicators
    with pytest.raises(ValueError, match="dimensions"):
        site_indicators(sites, {"kind": "clip", "dim": 8, "clip_weights": str(path)})


def test_feddp_inconsistency_weights_disagreeing_pixels():
    from fedmedbench.fl.methods.feddp import inconsistency

    a = torch.tensor([[[[9.0, -9.0]], [[-9.0, -9.0]]]])  # pixel 0 class 0, pixel 1 tie
    b = torch.tensor([[[[9.0, -9.0]], [[-9.0, 9.0]]]])   # pixel 0 same, pixel 1 class 1
    u = inconsistency(a, b)
    assert u.shape == (1, 1, 2)
    assert u[0, 0, 0] < 1e-6 and 0.4 < u[0, 0, 1] <= 1.0


def test_every_site_and_the_upperbound_take_exactly_local_steps(clips, tmp_path, monkeypatch):
    """The paper's 100 iterations per round, whatever a site's size (here 3 vs the engine's 1)."""
    from fedmedbench.fl.api.arrays import model_arrays
    from fedmedbench.fl.tasks import segmentation

    seen = []
    monkeypatch.setattr(segmentation, "train_steps", lambda model, data, steps, *a, **k: seen.append(steps) or 0.0)
    cfg = study_cfg()
    cfg["train"] = {**cfg["train"], "local_steps": 3}
    for method in ("seg_fedavg", "seg_centralized", "fedst"):
        spec = make_spec(clips, tmp_path, method, "abl_ts_cs" if method == "fedst" else "main", cfg)
        m = get_method(spec.method, spec.method_params)
        model = fed.new_model(spec)
        fed.client_train(Job(spec), 0, 1, model_arrays(model, m.shared_keys(model)), 1, {})
    assert seen == [3, 3, 3]
    cfg["train"]["local_steps"] = None
    spec = make_spec(clips, tmp_path, "seg_fedavg", "main", cfg)
    m = get_method(spec.method, spec.method_params)
    model = fed.new_model(spec)
    fed.client_train(Job(spec), 0, 1, model_arrays(model, m.shared_keys(model)), 1, {})
    assert seen[-1] == 1  # null: the engine's epochs-based count


def test_upperbound_takes_the_sum_of_the_sites_steps_as_option(clips, tmp_path, monkeypatch):
    """``seg_centralized.steps: sum_of_sites``: local_steps x the number of sites per round (the
    federation's total); the default takes local_steps, each site model's schedule."""
    from fedmedbench.fl.api.arrays import model_arrays
    from fedmedbench.fl.tasks import segmentation

    seen = []
    monkeypatch.setattr(segmentation, "train_steps", lambda model, data, steps, *a, **k: seen.append(steps) or 0.0)
    for params in ({}, {"seg_centralized": {"steps": "sum_of_sites"}}):
        cfg = study_cfg(method_params=params)
        cfg["train"] = {**cfg["train"], "local_steps": 3}
        spec = make_spec(clips, tmp_path, "seg_centralized", "main", cfg)
        m = get_method(spec.method, spec.method_params)
        model = fed.new_model(spec)
        fed.client_train(Job(spec), 0, 1, model_arrays(model, m.shared_keys(model)), 1, {})
    assert seen == [3, 2 * 3]  # two federated sites, A and B
    with pytest.raises(ValueError, match="steps"):
        get_method("seg_centralized", {"steps": "all"})


def test_fedrep_trains_the_head_first_then_the_body(clips, tmp_path, monkeypatch):
    """FedRep's reference split: 4/5 of the round on the decoder (head) alone, then 1/5 on the rest."""
    from fedmedbench.fl.api.arrays import model_arrays
    from fedmedbench.fl.methods import fedrep
    from fedmedbench.fl.tasks import segmentation

    calls = []

    def fake(model, data, steps, *a, params=None, **k):
        calls.append((steps, {id(p) for p in params}))
        return 0.0

    monkeypatch.setattr(segmentation, "train_steps", fake)
    monkeypatch.setattr(fedrep, "train_steps", fake)  # bound at import
    cfg = study_cfg()
    cfg["train"] = {**cfg["train"], "local_steps": 10}
    spec = make_spec(clips, tmp_path, "fedrep", "main", cfg)
    m = get_method(spec.method, spec.method_params)
    model = fed.new_model(spec)
    captured = {}
    real_prepare = m.prepare

    def prepare(ctx):
        captured["model"] = real_prepare(ctx)
        return captured["model"]

    monkeypatch.setattr(type(m), "prepare", lambda self, ctx: prepare(ctx))
    from fedmedbench.fl.api import registry

    monkeypatch.setattr(registry, "get_method", lambda *a, **k: m)
    monkeypatch.setattr(fed, "get_method", lambda *a, **k: m, raising=False)
    fed.client_train(Job(spec), 0, 1, model_arrays(model, m.shared_keys(model)), 1, {})
    net = captured["model"]
    head = {id(p) for n, p in net.named_parameters() if n.startswith("decoder.")}
    body = {id(p) for n, p in net.named_parameters() if not n.startswith("decoder.")}
    assert [c[0] for c in calls] == [8, 2]
    assert calls[0][1] == head and calls[1][1] == body


class _TinySeg(torch.nn.Module):
    """logits = w * (current frame's first channel) for class 1, 0 for class 0."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        f = x[:, -1, 0].float()
        return torch.stack([torch.zeros_like(f), self.w * f], dim=1)


class _Batches:
    def __init__(self, xs, ys):
        self.xs, self.ys, self.seen = xs, ys, []

    def batches(self, size):
        for i in range(0, len(self.xs), size):
            self.seen.append(i)
            yield torch.stack(self.xs[i:i + size]), torch.stack(self.ys[i:i + size])


def test_fedas_fisher_trace_sums_every_training_batch():
    from types import SimpleNamespace

    from fedmedbench.fl.api import TrainConfig

    xs = [torch.full((1, 3, 1, 1), float(v)) for v in (1.0, 2.0, 3.0)]
    ys = [torch.tensor([[1]]), torch.tensor([[0]]), torch.tensor([[1]])]
    data = _Batches(xs, ys)
    ctx = SimpleNamespace(data=SimpleNamespace(train=data), train=TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1),
                          device=torch.device("cpu"))
    method = get_method("fedas", {})
    model = _TinySeg()
    got = method._fisher_trace(ctx, model)
    # by hand: NLL of class y with logits (0, w f) is softplus(w f) - y w f; d/dw = f (sigmoid(w f) - y)
    expect = 0.0
    for batch in ((0, 1), (2,)):
        g = np.mean([float(xs[i].flatten()[0]) * (1 / (1 + np.exp(-0.5 * float(xs[i].flatten()[0]))) - int(ys[i])) for i in batch])
        expect += g ** 2
    assert got == pytest.approx(expect, rel=1e-5)
    assert data.seen == [0, 2]  # all the site's training data, not a fixed number of batches
    python_sum = 0.0  # the batches' float32 sums added as Python floats: the device's float64 additions give the same bits
    for batch in ((0, 1), (2,)):
        x, y = torch.stack([xs[i] for i in batch]), torch.stack([ys[i] for i in batch])
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
        python_sum += float(sum((g ** 2).sum() for g in grads))
    assert got == python_sum
    assert get_method("fedas", {"fisher_batches": 1})._fisher_trace(ctx, model) == pytest.approx(
        (np.mean([1.0 * (1 / (1 + np.exp(-0.5)) - 1), 2.0 * (1 / (1 + np.exp(-1.0)))])) ** 2, rel=1e-5)


def test_fedas_alignment_pulls_shared_features_to_the_previous_models_prototypes(monkeypatch):
    """One SGD epoch (lr 0.01) over every training batch on sum_c MSE(feature of class c, prototype_c)."""
    from types import SimpleNamespace

    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.methods import fedas

    class Feat(torch.nn.Module):  # feature of a pixel = a * x; personal head unused here
        def __init__(self, a):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor(float(a)))

        def set_indicator(self, v):
            pass

    monkeypatch.setattr(fedas, "pixel_features", lambda m, x, y, *a: ((m.a * x[:, -1, 0].float()).reshape(-1, 1), y.reshape(-1)))
    xs = [torch.full((1, 3, 1, 1), 1.0), torch.full((1, 3, 1, 1), 1.0)]
    ys = [torch.tensor([[1]]), torch.tensor([[1]])]
    data = _Batches(xs, ys)
    assert get_method("fedas", {}).p["align_batch_size"] == 16  # the reference's fixed loader
    method = get_method("fedas", {"align_batch_size": 1})
    monkeypatch.setattr(type(method), "shared_keys", lambda self, m: ["a"])
    prev = {"a": torch.tensor(3.0)}  # the site's previous model: prototype of class 1 = 3
    ctx = SimpleNamespace(data=SimpleNamespace(train=data, indicator=None), state={"personal": {}, "previous": prev},
                          train=TrainConfig(rounds=1, local_epochs=1, batch_size=1, lr=0.1), device=torch.device("cpu"))
    model = Feat(1.0)
    method._align(ctx, model)
    # prototypes: 1 pass (2 batches); alignment: 1 pass (2 batches), each a <- a - 0.01 * 2 (a - 3)
    a = 1.0
    for _ in range(2):
        a -= 0.01 * 2 * (a - 3.0)
    assert float(model.a.detach()) == pytest.approx(a)
    assert data.seen == [0, 1, 0, 1]


def test_fedas_alignment_runs_in_eval_mode_batch_norm_keeps_its_running_statistics(monkeypatch):
    """``align_mode: eval`` (default, the reference): BN normalises by its running statistics and
    leaves them unchanged; ``align_mode: train``: batch statistics, running statistics updated."""
    from types import SimpleNamespace

    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.methods import fedas

    class BNFeat(torch.nn.Module):  # feature of a pixel = BN(a * x), one channel, no affine parameters
        def __init__(self, a: float) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor(a))
            self.bn = torch.nn.BatchNorm1d(1, affine=False)
            self.bn.running_mean.fill_(0.5)
            self.bn.running_var.fill_(4.0)

        def set_indicator(self, v) -> None:
            pass

    monkeypatch.setattr(fedas, "pixel_features", lambda m, x, y, *a: (m.bn((m.a * x[:, -1, 0].float()).reshape(-1, 1)), y.reshape(-1)))
    pixels = [[1.0, 3.0], [1.0, 2.0]]  # two clips of two pixels, all of class 1
    xs = [torch.tensor(v).reshape(1, 1, 2).expand(3, 1, 1, 2).clone() for v in pixels]
    ys = [torch.ones(1, 2, dtype=torch.long) for _ in pixels]

    def align(params: dict) -> BNFeat:
        method = get_method("fedas", {"align_batch_size": 1, **params})
        monkeypatch.setattr(type(method), "shared_keys", lambda self, m: ["a"])
        prev = {k: v.clone() for k, v in BNFeat(3.0).state_dict().items()}  # the site's previous model: a = 3
        ctx = SimpleNamespace(data=SimpleNamespace(train=_Batches(xs, ys), indicator=None), state={"personal": {}, "previous": prev},
                              train=TrainConfig(rounds=1, local_epochs=1, batch_size=1, lr=0.1), device=torch.device("cpu"))
        model = BNFeat(1.0)
        method._align(ctx, model)
        return model

    assert get_method("fedas", {}).p["align_mode"] == "eval"
    model = align({})
    assert float(model.bn.running_mean) == 0.5 and float(model.bn.running_var) == 4.0
    assert int(model.bn.num_batches_tracked) == 0
    # by hand with the running statistics: f = (a x - 0.5) / s, prototype = mean over all pixels at a = 3
    s = np.sqrt(4.0 + model.bn.eps)
    proto = np.mean([(3.0 * x - 0.5) / s for v in pixels for x in v])
    a = 1.0
    for v in pixels:  # one SGD step (lr 0.01) per clip on the MSE to the prototype
        a -= 0.01 * np.mean([2 * ((a * x - 0.5) / s - proto) * x / s for x in v])
    assert float(model.a.detach()) == pytest.approx(a, rel=1e-6)

    trained = align({"align_mode": "train"})
    assert int(trained.bn.num_batches_tracked) == 2 and float(trained.bn.running_mean) != 0.5
    assert float(trained.bn.running_var) != 4.0 and float(trained.a.detach()) != pytest.approx(a, rel=1e-6)
    with pytest.raises(ValueError, match="align_mode"):
        get_method("fedas", {"align_mode": "batch"})


@pytest.mark.parametrize("size", [0, -4, 2.5, "16", True])
def test_fedas_align_batch_size_must_be_a_positive_integer(size):
    with pytest.raises(ValueError, match=r"method_params\.fedas\.align_batch_size"):
        get_method("fedas", {"align_batch_size": size})


def test_fedas_aligns_every_shared_layer_through_the_classifiers_input_from_round_one():
    """The reference aligns ``model.base`` (all but the head) on the head's input, already in the
    first round (previous model = the initial one); ``representation: deep`` stops at the encoder."""
    from types import SimpleNamespace

    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.models.fedst import build_fedst_net

    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, 256, (1, 3, 32, 32), generator=g, dtype=torch.uint8) for _ in range(3)]
    ys = [torch.randint(0, 3, (32, 32), generator=g) for _ in range(3)]

    def changed(params: dict) -> set[str]:
        torch.manual_seed(0)
        net = build_fedst_net({"temporal": False, "selection": "none", "num_classes": 3, "decoder": "light", "decoder_dim": 8})
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        data = _Batches(xs, ys)
        ctx = SimpleNamespace(data=SimpleNamespace(train=data, indicator=torch.zeros(512)), state={},
                              train=TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1), device=torch.device("cpu"))
        get_method("fedas", params)._align(ctx, net)
        assert data.seen == [0, 0]  # one batch of up to 16 clips for the prototypes, one for the alignment
        return {n for n, p in net.named_parameters() if not torch.equal(p.detach(), before[n])}

    head_input = changed({})
    assert any(n.startswith("encoder.") for n in head_input)
    assert {"decoder.fuse.0.weight", "decoder.proj.0.weight", "decoder.attn.v.weight"} <= head_input
    assert not any(n.startswith("decoder.head.") for n in head_input)  # the personal classifier is not aligned
    deep = changed({"representation": "deep"})
    assert any(n.startswith("encoder.") for n in deep) and not any(n.startswith("decoder.") for n in deep)


def test_fedavg_weights_by_training_clips_uniform_as_option():
    from fedmedbench.fl.api import ClientResult, ServerContext, TrainConfig

    a, b = {"w": np.zeros(2, np.float32)}, {"w": np.ones(2, np.float32)}

    def ctx():  # the study's train.aggregation is uniform (FedST); FedAvg still weighs by examples
        return ServerContext(rnd=1, global_arrays=a, results=[ClientResult(a, 1), ClientResult(b, 3)], pids=[0, 1], state={},
                             num_clients=2, device=torch.device("cpu"), new_model=lambda: None,
                             train=TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1, aggregation="uniform"))

    assert np.allclose(get_method("seg_fedavg", {}).aggregate(ctx())["w"], 0.75)
    assert np.allclose(get_method("seg_fedavg", {"aggregation": "uniform"}).aggregate(ctx())["w"], 0.5)
    assert np.allclose(get_method("seg_fedavg", {"aggregation": None}).aggregate(ctx())["w"], 0.5)


def test_fedrep_weights_the_representation_by_training_clips_uniform_as_option():
    """FedRep's reference weighs each site's model by its training samples, even where the
    study's ``train.aggregation`` is uniform (FedST's own rule)."""
    from fedmedbench.fl.api import ClientResult, ServerContext, TrainConfig

    a, b = {"w": np.zeros(2, np.float32)}, {"w": np.ones(2, np.float32)}

    def ctx():
        return ServerContext(rnd=1, global_arrays=a, results=[ClientResult(a, 1), ClientResult(b, 3)], pids=[0, 1], state={},
                             num_clients=2, device=torch.device("cpu"), new_model=lambda: None,
                             train=TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1, aggregation="uniform"))

    assert np.allclose(get_method("fedrep", {}).aggregate(ctx())["w"], 0.75)  # 3 of 4 clips
    assert np.allclose(get_method("fedrep", {"aggregation": "uniform"}).aggregate(ctx())["w"], 0.5)
    assert np.allclose(get_method("fedrep", {"aggregation": None}).aggregate(ctx())["w"], 0.5)


def test_feddp_calibration_stage_after_federated_rounds(clips, tmp_path):
    """Round 1 federated (queries stay home, but are sent once as an extra for the memory models);
    round 2 = the reference's calibration: no aggregation, each site fine-tunes its whole model."""
    from fedmedbench.fl.methods.feddp import SITES, spread_map, weighted_bce

    spec = make_spec(clips, tmp_path, "feddp")
    transport = Recorder(spec)
    state = fed.Federation(spec, log=lambda m: None).run(transport)
    (r1, sent1, res1), (r2, sent2, res2) = transport.replies
    q = "encoder.backbone.stages.0.blocks.0.attn.q.weight"
    assert q not in res1[0].arrays and q in res1[0].extras["queries"]  # queries: only as the declared extra
    assert res2[0].arrays == {} and res2[1].arrays == {}  # calibration sends nothing
    for k, v in sent2.items():  # calibration does not aggregate: the global model stays as after round 1
        assert np.array_equal(state.arrays[k], v)
    assert set(state.server_state["_broadcast"][SITES]) >= {f"0/{q}", f"1/{q}"}
    # spread map and weighted BCE on hand-made predictions
    probs = torch.tensor([[[[0.9]], [[0.1]]], [[[0.5]], [[0.5]]]])[:, None]  # K=2 models, B=1, C=2, 1x1
    u = spread_map(probs)
    assert torch.allclose(u, torch.ones_like(u))  # equal spread on both classes, normalised to 1
    p = torch.tensor([[[[0.8]], [[0.2]]]])
    bce = weighted_bce(p, torch.tensor([[[0]]]), torch.tensor([[[[1.0]], [[0.0]]]]))
    assert float(bce) == pytest.approx(-np.log(0.8) / 2)


def test_feddp_paper_text_reading_sends_the_decoder_and_head_only(clips, tmp_path):
    """``method_params.feddp.sent: paper_text`` (FedST Table IX's 6.7 MB): a site's reply carries
    the decoder's and head's parameters and nothing else (the reply check accepts exactly those);
    the encoder, queries included, and the decoder's BatchNorm statistics stay on the site, and the
    encoder goes to the memory models as the site's personal part. The default reading sends every
    parameter but the encoder queries."""
    cfg = study_cfg(method_params={"feddp": {"sent": "paper_text"}})
    spec = make_spec(clips, tmp_path, "feddp", cfg=cfg)
    transport = Recorder(spec)
    fed.Federation(spec, log=lambda m: None).run(transport)
    (_, _, res1), (_, _, res2) = transport.replies
    net = fed.new_model(spec)
    params = [n for n, _ in net.named_parameters()]
    decoder = [n for n in params if n.startswith("decoder.")]
    assert "decoder.head.weight" in decoder and "decoder.fuse.1.running_mean" not in decoder
    assert all(list(r.arrays) == decoder for r in res1.values())
    encoder = [n for n in params if n.startswith("encoder.")]
    assert set(encoder) <= set(res1[0].extras["queries"]) and not set(decoder) & set(res1[0].extras["queries"])
    assert res2[0].arrays == {}  # the calibration round sends nothing under either reading
    default = get_method("feddp", {})
    assert default.shared_keys(net) == [n for n in params if not re.match(r"encoder\..*\.attn\.q\.", n)]


def test_serq_moving_average_and_which_model_each_step_trains(clips):
    """Eq. 10: F_hat = (1 - mu) F_hat_prev + mu F_g; Eq. 12 trains the global model only (v_pre fixed)."""
    from types import SimpleNamespace

    from fedmedbench.fl.api.arrays import load_arrays, model_arrays
    from fedmedbench.fl.methods.fedst import SERQ_DEFAULTS, serq_round
    from fedmedbench.fl.tasks.segmentation import load_clipset
    from fedmedbench.models.fedst import build_fedst_net

    tiny = {"window": 2, "pools": [2, 1, 1, 1], "fields": [4, 3, 2, 2], "indicator_dim": 8, "decoder": "light", "temporal_at": "encoder", "decoder_dim": 16}

    def new_model():
        torch.manual_seed(0)
        return build_fedst_net(tiny)

    gamma = model_arrays(new_model())
    base = {**SERQ_DEFAULTS, "clips_root": str(clips), "site": "sim", "num_frames": 4, "steps": 1, "probe": 2, "mu": 0.5,
            "indicator": {"kind": "onehot", "dim": 8}, "loss": {"dice_weight": 0.3}, "input_size": [32, 32]}

    def run(cfg, state):
        ctx = SimpleNamespace(seed=0, rnd=2, device=torch.device("cpu"), state=state, new_model=new_model, loader_workers=0,
                              image_cache=None)
        return serq_round(ctx, dict(gamma), cfg), ctx.state

    prev = torch.zeros(1)
    out_a, st_a = run(base, {"serq_Fg": prev})
    # F_g of the received global model on the probe frames, by hand
    glob = new_model()
    load_arrays(glob, gamma)
    glob.eval()
    glob.set_indicator(torch.nn.functional.one_hot(torch.tensor(3), 8).float())
    probe, _ = load_clipset(clips, "sim", None, 4, (32, 32)).batch([0, 1])
    with torch.no_grad():
        f_g = glob.features(probe[:, -1])[-1].mean(0)
    assert torch.allclose(st_a["serq_Fg"], 0.5 * prev + 0.5 * f_g, atol=1e-5)
    # v_pre after the round does not depend on Eq. 12's weight (v_pre is fixed there) ...
    out_b, st_b = run({**base, "lambda3": 5.0}, {"serq_Fg": prev})
    for k in st_a["serq_pre"]:
        assert torch.equal(st_a["serq_pre"][k], st_b["serq_pre"][k]), k
    # ... while the global model Eq. 12 trains does
    assert any(not np.allclose(out_a[k], out_b[k]) for k in out_a if out_a[k].is_floating_point())
    # Eq. 11 trained v_pre away from the initial model
    init = model_arrays(new_model())
    assert any(not np.allclose(st_a["serq_pre"][k].numpy(), init[k]) for k in init if init[k].is_floating_point())


def _tiny_server(clips, **over):
    from types import SimpleNamespace

    from fedmedbench.fl.methods.fedst import SERQ_DEFAULTS
    from fedmedbench.models.fedst import build_fedst_net

    def new_model():
        torch.manual_seed(0)
        return build_fedst_net({"window": 2, "pools": [2, 1, 1, 1], "fields": [4, 3, 2, 2], "indicator_dim": 8, "decoder": "light", "temporal_at": "encoder", "decoder_dim": 16})

    cfg = {**SERQ_DEFAULTS, "clips_root": str(clips), "site": "sim", "num_frames": 4, "steps": 2, "probe": 2,
           "indicator": {"kind": "onehot", "dim": 8}, "loss": {"dice_weight": 0.3}, "input_size": [32, 32], **over}
    return cfg, new_model, lambda state: SimpleNamespace(seed=0, rnd=1, device=torch.device("cpu"), state=state,
                                                         new_model=new_model, loader_workers=0, image_cache=None)


def test_fig5_server_finetuning_is_plain_segmentation_loss_on_synthetic_batches(clips):
    """Fig. 5 (blue): the averaged model takes serq.steps L_seg steps on synthetic clips; no
    descriptor, no v_pre, no feature term (lambda2/lambda3 change nothing); BN statistics kept."""
    from fedmedbench.fl.api.arrays import model_arrays
    from fedmedbench.fl.methods.fedst import finetune_round

    cfg, new_model, ctx = _tiny_server(clips)
    gamma = model_arrays(new_model())
    state: dict = {}
    out = finetune_round(ctx(state), dict(gamma), cfg)
    assert set(state) == {"serq_rho"} and state["serq_rho"] == {}  # no v_pre, D_sy, F_hat; nothing personal in this gamma
    out_l = finetune_round(ctx({}), dict(gamma), {**cfg, "lambda2": 9.0, "lambda3": 9.0})
    assert all(np.array_equal(out[k], out_l[k]) for k in out)
    weights = [k for k in gamma if k.endswith("weight") and gamma[k].is_floating_point()]
    assert any(not np.allclose(out[k], gamma[k]) for k in weights)  # the global model was trained
    stats = [k for k in gamma if k.endswith(("running_mean", "running_var"))]
    assert stats and all(np.array_equal(out[k], gamma[k]) for k in stats)


def test_fig5_sites_finetune_on_synthetic_clips_after_their_local_steps(clips, tmp_path, monkeypatch):
    """Fig. 5 (green): syn_sites = no SERQ on the server; each site, after its E real iterations,
    takes serq.steps steps on the simulator clips with the temporal module bypassed."""
    from types import SimpleNamespace

    import fedmedbench.fl.tasks.segmentation as seg

    cfg = study_cfg(serq={**study_cfg()["serq"], "steps": 3})
    spec = make_spec(clips, tmp_path, "fedst", "syn_sites", cfg)
    method = get_method("fedst", spec.method_params)
    assert not method.serq["enabled"] and method.p["site_finetune"] == 3
    calls = []
    monkeypatch.setattr(seg, "train_steps", lambda model, data, steps, *a, temporal=True, **k: calls.append((data.source, steps, temporal)) or 1.0)
    train = SimpleNamespace(lr_at=lambda r: 1e-3)
    site = SimpleNamespace(train=seg.ClipSet([], [], "site A train"), loss={})
    method.local_train(SimpleNamespace(data=site, steps=5, train=train, rnd=1, device="cpu", generator=None), torch.nn.Linear(1, 1))
    assert calls[0] == ("site A train", 5, True)
    assert "sim" in calls[1][0] and calls[1][1:] == (3, False) and len(calls) == 2
    main = get_method("fedst", make_spec(clips, tmp_path, "fedst", "main", cfg).method_params)
    calls.clear()
    main.local_train(SimpleNamespace(data=site, steps=5, train=train, rnd=1, device="cpu", generator=None), torch.nn.Linear(1, 1))
    assert calls == [("site A train", 5, True)]


def test_synmix_puts_every_synthetic_clip_into_each_site_and_once_into_the_pool(clips, tmp_path):
    from fedmedbench.fl.tasks.base import task_for

    cfg = study_cfg()
    cfg["train"] = {**cfg["train"], "local_steps": 3}
    real = task_for(make_spec(clips, tmp_path, "seg_fedavg", cfg=cfg))
    mix = task_for(make_spec(clips, tmp_path, "seg_fedavg", "synmix", cfg))
    sim = 6  # every clip of the simulator site (all splits)
    assert mix.client_sizes() == [n + sim for n in real.client_sizes()]
    assert set(mix.site("A").train.mask_paths) - set(real.site("A").train.mask_paths) == {p for p in mix._synthetic().mask_paths}
    assert len(mix.pooled_data().train) == len(real.pooled_data().train) + sim
    assert len(mix.site("A").test) == len(real.site("A").test)  # tests stay real
    assert mix.site("A").local_steps == 2 * real.site("A").local_steps


def test_serq_server_keeps_its_own_rho_across_rounds(clips):
    """Algorithm 1 line 9: v_g^{t+1} = gamma_g^{t+1} with rho_g^t; lines 11-12: the server trains
    all of v_g, sends gamma_g only and keeps the updated rho_g for the next round."""
    from fedmedbench.fl.api.arrays import load_arrays, model_arrays
    from fedmedbench.fl.methods._seg_shared import personal_keys
    from fedmedbench.fl.methods.fedst import serq_round
    from fedmedbench.fl.tasks.segmentation import load_clipset

    cfg, new_model, ctx = _tiny_server(clips, steps=1, loss={"dice_weight": 0.3, "augment": False})
    model = new_model()
    rho = set(personal_keys(model, ["enc_q", "cs", "rsc"])) - {"cs.indicator"}
    gamma = {k: v for k, v in model_arrays(model).items() if k not in rho and k != "cs.indicator"}
    state: dict = {}
    out = serq_round(ctx(state), dict(gamma), cfg)
    assert set(out) == set(gamma) and set(state["serq_rho"]) == rho  # gamma goes out, rho stays
    init = model_arrays(new_model())
    assert any(not np.allclose(state["serq_rho"][k].numpy(), init[k]) for k in rho if k.startswith("encoder"))  # Eq. 12 moved rho_g
    # next round: F_g is computed with the kept rho_g, not the initial one
    kept = {k: v + 0.5 for k, v in state["serq_rho"].items()}
    st2 = {"serq_rho": kept}
    serq_round(ctx(st2), dict(gamma), cfg)
    glob = new_model()
    load_arrays(glob, {k: v.numpy() for k, v in kept.items()}, list(kept))
    load_arrays(glob, gamma, list(gamma))
    glob.eval()
    glob.set_indicator(torch.nn.functional.one_hot(torch.tensor(3), 8).float())
    probe, _ = load_clipset(clips, "sim", None, 4, (32, 32)).batch([0, 1])
    with torch.no_grad():
        f_g = glob.features(probe[:, -1])[-1].mean(0)
    assert torch.allclose(st2["serq_Fg"], f_g, atol=1e-5)  # round without a previous F_hat: F_hat = F_g


def test_serq_server_batches_are_rotated_and_scaled_as_the_sites(clips):
    """Sec. IV-A: "in each site or server training, data augmentation (rotation and scale)"."""
    from fedmedbench.fl.methods.fedst import _server_clips, synthetic_batches

    cfg, _, _ = _tiny_server(clips, steps=3, loss={"dice_weight": 0.3, "augment": True, "rotate_deg": 30, "scale": 0.2})
    data = _server_clips(cfg)
    raw = {tuple(data.batch([i])[1].flatten().tolist()) for i in range(len(data))}
    got = list(synthetic_batches(data, cfg, torch.Generator().manual_seed(0), torch.device("cpu")))
    assert len(got) == 3 and all(x.shape[0] == 2 for x, _ in got)
    assert all(tuple(y[i].flatten().tolist()) not in raw for _, y in got for i in range(2))  # every mask was transformed
    plain = list(synthetic_batches(data, {**cfg, "loss": {"augment": False}}, torch.Generator().manual_seed(0), torch.device("cpu")))
    assert all(tuple(y[i].flatten().tolist()) in raw for _, y in plain for i in range(2))


@pytest.mark.parametrize("workers", [0, 4])
def test_serq_server_batches_draw_as_one_step_at_a_time_and_decode_the_next_steps_ahead(clips, workers, monkeypatch):
    """The server's batches are the bits of drawing each step's clips, angles and scales from the generator a step
    at a time; each batch asks for the clips of the steps after it (as many as the threads, at least a batch)."""
    from fedmedbench.fl.methods import fedst
    from fedmedbench.fl.tasks.segmentation import ClipSet, augment

    cfg, _, _ = _tiny_server(clips, steps=5, batch_size=2, loss={"dice_weight": 0.3, "rotate_deg": 30, "scale": 0.2})
    data = fedst._server_clips(cfg, workers)
    g = torch.Generator().manual_seed(3)
    expected, drawn = [], []  # one step at a time: clips, then the augmentation's draws
    for _ in range(5):
        drawn.append(torch.randint(len(data), (2,), generator=g).tolist())
        expected.append(augment(*data.batch(drawn[-1]), g, 30.0, 0.2))
    after = g.get_state()
    asked: list[list[int]] = []
    real = ClipSet.batch
    monkeypatch.setattr(ClipSet, "batch", lambda self, idx, ahead=(): asked.append(list(ahead)) or real(self, idx, ahead))
    g = torch.Generator().manual_seed(3)
    got = list(fedst.synthetic_batches(data, cfg, g, torch.device("cpu")))
    assert torch.equal(g.get_state(), after)  # the generator is where the step-at-a-time loop left it
    assert len(got) == 5 and all(torch.equal(x, ex) and torch.equal(y, ey) for (x, y), (ex, ey) in zip(got, expected, strict=True))
    ahead = max(2, workers)
    assert asked == [[i for idx in drawn[k + 1:] for i in idx][:ahead] for k in range(5)]
    assert [len(a) for a in asked] == ([2, 2, 2, 2, 0] if workers == 0 else [4, 4, 4, 2, 0])
    fedst._SERVER_CLIPS.clear()


def test_a_fresh_model_is_built_once_and_copied_per_request(clips, tmp_path, monkeypatch):
    """Every request gets the seeded build's values in tensors of its own; a changed pre-trained file,
    seed or architecture is a new build."""
    from dataclasses import replace

    from fedmedbench.fl.methods import _seg_shared

    spec = make_spec(clips, tmp_path, "fedst")
    builds = []
    real = _seg_shared._build_seeded
    monkeypatch.setattr(_seg_shared, "_build_seeded", lambda s: builds.append(s.seed) or real(s))
    _seg_shared._BUILT.clear()
    a, b = _seg_shared.build_seeded(spec), _seg_shared.build_seeded(spec)
    assert len(builds) == 1
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) and sa[k].data_ptr() != sb[k].data_ptr() for k in sa)
    next(a.parameters()).data.add_(1.0)  # what training does to one copy never reaches the next
    c = _seg_shared.build_seeded(spec)
    assert all(torch.equal(sb[k], v) for k, v in c.state_dict().items())
    assert len(builds) == 1

    _seg_shared.build_seeded(replace(spec, seed=1))
    assert builds == [0, 1]
    pre = tmp_path / "pre.pt"
    torch.save({k: v + 0.5 for k, v in sb.items() if k.endswith("weight")}, pre)
    first = _seg_shared.build_seeded(replace(spec, pretrained_path=str(pre)))
    torch.save({k: v - 0.5 for k, v in sb.items() if k.endswith("weight")}, pre)
    os.utime(pre, ns=(1, 10**18))  # a rewritten file, whatever the clock's resolution
    second = _seg_shared.build_seeded(replace(spec, pretrained_path=str(pre)))
    assert len(builds) == 4
    q = "decoder.head.weight"
    assert torch.allclose(first.state_dict()[q], sb[q] + 0.5) and torch.allclose(second.state_dict()[q], sb[q] - 0.5)


def test_clip_loading_bench_reshuffles_past_the_clips_and_names_a_site_without_test_clips(clips):
    """bench/clip_loading.py: more steps than a site's clips reshuffle (as train_steps does); its metrics row
    scores every test frame; a site without test clips is named, not a traceback."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import clip_loading

    row = clip_loading.time_site(clips, "A", 5, 2, 0.0, (32, 32))  # 4 training clips, 5 steps of 2
    assert row["clips"] == 4 and row["steps"] == 5 and row["distinct_frames_per_clip"] == 4.0
    assert 0 < row["batch_ms_per_step"] + row["augment_ms_per_step"] <= row["ms_per_step"] + 0.1 and not row["image_cache"]
    server = clip_loading.time_server(clips, "sim", 3, 2, 0.0, (32, 32))  # FedST's server batches, timed apart
    assert server["server_site"] == "sim" and server["steps"] == 3 and server["loader_workers"] == 2
    assert 0 < server["batch_ms_per_step"] and 0 <= server["augment_ms_per_step"]
    assert server["batch_ms_per_step"] + server["augment_ms_per_step"] <= server["ms_per_step"] + 0.1
    scored = clip_loading.time_metrics(clips, "A", (32, 32), 2)
    assert scored["frames"] == 2 and scored["parts"] == 3 and scored["ms_per_frame"] > 0
    (clips / "Z").mkdir(exist_ok=True)
    pd.DataFrame({"site": ["Z"], "dataset": ["Z"], "split": ["train"], "video_id": ["v"], "frame": [0],
                  "timestamp_s": [0.0], "clip_paths": [[str(clips / "raw" / "A" / "c0_f0.png")] * 4],
                  "clip_offsets_s": [[-0.6, -0.4, -0.2, 0.0]], "n_duplicated": [3],
                  "mask_path": [str(clips / "raw" / "A" / "c0_mask.png")]}).to_parquet(clips / "Z" / "clips.parquet")
    with pytest.raises(SystemExit, match="site Z has no test clips"):
        clip_loading.time_metrics(clips, "Z", (32, 32), 0)
    with pytest.raises(SystemExit, match="site Z has 1 training clips, fewer than a batch of 2"):
        clip_loading.time_site(clips, "Z", 1, 0, 0.0, (32, 32))
    with pytest.raises(SystemExit, match="site Z has 1 clips, fewer than a batch of 2"):
        clip_loading.time_server(clips, "Z", 1, 0, 0.0, (32, 32))


def test_evaluation_at_native_units_or_native_resolution_on_request(clips):
    """The 64x64 synthetic frames scored at 32x32: ``resolution: native_units`` doubles every HD95 / ASSD
    (spacing 2 on both axes), overlaps unchanged; ``native`` scores each prediction upsampled (bilinear
    logits) to 64x64 against the mask file; ``assd: medpy_0_4`` changes ASSD only."""
    from PIL import Image

    from fedmedbench.fl.tasks.segmentation import evaluate_clips, load_clipset
    from fedmedbench.metrics.segmentation import SegmentationMeter
    from fedmedbench.models.fedst import build_fedst_net

    torch.manual_seed(0)
    net = build_fedst_net({"temporal": False, "selection": "none", "num_classes": 4}).eval()
    data = load_clipset(clips, "A", "test", 4, (32, 32))
    classes = {1: "shaft", 2: "wrist", 3: "jaws"}
    cpu = torch.device("cpu")
    base = evaluate_clips(net, data, classes, cpu, 4)
    units = evaluate_clips(net, data, classes, cpu, 4, resolution="native_units")
    old = evaluate_clips(net, data, classes, cpu, 4, assd="medpy_0_4")
    for k, v in base.items():
        m = k.split("_")[0]
        assert units[k] == pytest.approx(2 * v if m in ("hd95", "assd") else v, rel=1e-12), k
        if m != "assd":
            assert old[k] == v, k
    meter = SegmentationMeter(classes)
    with torch.no_grad():
        for i in range(len(data)):
            gt = np.asarray(Image.open(data.mask_paths[i]))
            assert gt.shape == (64, 64)
            logits = net(data.batch([i])[0])
            up = torch.nn.functional.interpolate(logits, size=(64, 64), mode="bilinear", align_corners=False)
            meter.add(up.argmax(dim=1)[0].numpy(), gt)
    want = {k.removeprefix("mean_"): v for k, v in meter.result().items()}
    with torch.no_grad():
        assert evaluate_clips(net, data, classes, cpu, 4, resolution="native") == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="eval.resolution"):
        evaluate_clips(net, data, classes, cpu, 4, resolution="mm")


@pytest.mark.parametrize("resolution", ["input", "native_units", "native"])
@pytest.mark.parametrize("class_rule", ["all_classes", "gt_classes"])
def test_evaluation_scored_with_torch_is_the_numpy_evaluation(clips, resolution, class_rule):
    """``metrics_device: torch`` (here on the CPU) gives the NumPy/SciPy scores: every metric to the bit but
    ASSD, within 1e-12 relative (tests/test_segmetrics_device.py); ``auto`` on the CPU is the NumPy path."""
    from fedmedbench.fl.tasks.segmentation import evaluate_clips, load_clipset
    from fedmedbench.models.fedst import build_fedst_net

    torch.manual_seed(0)
    net = build_fedst_net({"temporal": False, "selection": "none", "num_classes": 4}).eval()
    data = load_clipset(clips, "A", "test", 4, (32, 32))
    classes = {1: "shaft", 2: "wrist", 3: "jaws"}
    cpu = torch.device("cpu")
    kw = {"resolution": resolution, "class_rule": class_rule}
    want = evaluate_clips(net, data, classes, cpu, 4, metrics_device="cpu", **kw)
    got = evaluate_clips(net, data, classes, cpu, 4, metrics_device="torch", **kw)
    assert evaluate_clips(net, data, classes, cpu, 4, **kw) == want
    assert got.keys() == want.keys()
    for k, v in want.items():
        if k.startswith("assd"):
            assert got[k] == pytest.approx(v, rel=1e-12, nan_ok=True), k
        else:
            assert got[k] == v or (np.isnan(v) and np.isnan(got[k])), k


@pytest.mark.parametrize("method", FS.METHODS)
def test_every_segmentation_methods_honest_replies_pass_the_servers_checks(clips, tmp_path, method, monkeypatch):
    """Two rounds per method (FedDP: its queries round, then calibration): every site's reply is checked against
    what the method declares (``Method.reply_keys``) and accepted."""
    from test_methods import checked_replies, run_and_check_replies

    seen = run_and_check_replies(make_spec(clips, tmp_path, method), checked_replies(monkeypatch))
    if method == "feddp":
        assert seen[0][3] == ["queries"] and seen[-1][2] == []  # the queries round, then calibration sends nothing
