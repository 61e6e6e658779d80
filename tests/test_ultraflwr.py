"""UltraFlwr: component key maps, Table I from the model, what partial aggregation does and does
not aggregate, persistent client components across rounds and resume, the YOLO wrapper's
weight capture, and one small federated run through the detection task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import surgical as F

from fedmedbench.fl.api import ClientResult, ServerContext, TrainConfig
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.detection import components as C
from fedmedbench.fl.tasks.detection.yolo import build_yolo, train_yolo


@pytest.fixture(scope="module")
def yolo80():
    return build_yolo("yolo11n.yaml", 80, seed=0)


def test_fourteen_strategies_parse():
    names = C.strategy_names()
    assert len(names) == 14 and len(set(names)) == 14
    assert C.parse_strategy("FedBackboneNeckMedian") == (("backbone", "neck"), "median")
    assert C.parse_strategy("FedAvg") == (("backbone", "neck", "head"), "mean")
    with pytest.raises(ValueError, match="unknown strategy"):
        C.parse_strategy("FedTailAvg")


def test_table1_counts_from_the_model(yolo80):
    """Whole state_dict 2,639,825 elements, Detect head 468,034; the 2025-01 split reproduces the paper."""
    from fedmedbench.studies.ultraflwr.report import PAPER_TABLE1, table1

    for split in C.SPLITS:
        sizes = C.component_sizes(yolo80, split)
        assert sum(sizes.values()) == 2_639_825
        assert sizes["head"] == 468_034
    t = table1("yolo11n.yaml", 80)
    old = t[t["split"] == "ultraflwr_2025_01"].set_index("strategy")
    assert all(old.loc[name, "saved"] == saved for name, saved in PAPER_TABLE1.items())
    cur = t[t["split"] == "ultraflwr"].set_index("strategy")
    assert cur.loc["FedNeckHead", "saved"] == 955_951  # backbone = layers 0-8 in UltraFlwr's current code
    assert not cur["matches_paper"].all()


def test_key_maps_partition_the_learnt_keys(yolo80):
    state = yolo80.state_dict()
    for split in C.SPLITS:
        keys = C.component_keys(yolo80, split)
        flat = [k for c in C.COMPONENTS for k in keys[c]]
        assert len(flat) == len(set(flat))
        assert set(flat) == {k for k in state if C.is_learnt(k)}
        assert all(k.startswith("model.23.") for k in keys["head"])
    yaml_keys = C.component_keys(yolo80, "yaml")
    assert any(k.startswith("model.10.") for k in yaml_keys["backbone"])  # C2PSA is in the yaml's backbone
    assert any(k.startswith("model.9.") for k in C.component_keys(yolo80, "ultraflwr")["neck"])  # SPPF = neck
    sent = C.aggregated_keys(yolo80, ("backbone", "neck", "head"), "ultraflwr")
    assert not any(k.endswith("num_batches_tracked") or ".dfl." in k for k in sent)


def _results(method, model, n=3):
    keys = method.shared_keys(model)
    rng = np.random.default_rng(0)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    out = []
    for i in range(n):
        arrays = {k: torch.from_numpy(state[k] + rng.normal(size=state[k].shape).astype(state[k].dtype)) for k in keys}
        out.append(ClientResult(arrays=arrays, num_examples=[1, 2, 7][i]))
    return keys, out


@pytest.mark.parametrize("strategy", C.strategy_names())
def test_aggregation_only_touches_selected_components(strategy):
    """Each of the 14 strategies aggregates exactly its components' keys (mean or median) and nothing else."""
    method = get_method("ultraflwr", {"strategy": strategy, "weighting": "frames"})
    model = build_yolo("yolo11n.yaml", 3, seed=0)
    keys, results = _results(method, model)
    old = {k: v.clone() for k, v in model.state_dict().items() if k in keys}
    ctx = ServerContext(rnd=1, global_arrays=old, results=results, pids=[0, 1, 2], state={}, num_clients=3,
                        device=torch.device("cpu"), train=TrainConfig(rounds=3, local_epochs=1, batch_size=8, lr=0.01),
                        new_model=lambda: model)
    new = method.aggregate(ctx)
    assert set(new) == set(keys)
    k = keys[0]
    stack = np.stack([r.arrays[k].numpy() for r in results])
    expected = np.median(stack, 0) if "Median" in strategy else np.tensordot(np.array([1, 2, 7]) / 10, stack, 1)
    np.testing.assert_allclose(new[k], expected, rtol=1e-5, atol=1e-6)
    components, _ = C.parse_strategy(strategy)
    other = [c for c in C.COMPONENTS if c not in components]
    component_keys = C.component_keys(model, "ultraflwr")
    assert not set(new) & {k for c in other for k in component_keys[c]}
    assert set(new) == {k for c in components for k in component_keys[c]} & set(keys)
    assert ctx.state["ultraflwr_clients"][0]["round"] == 1


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from fedmedbench.data.surgical import recurate as R
    from fedmedbench.data.surgical.export_yolo import export_group
    from fedmedbench.data.surgical.group_io import write_group
    from fedmedbench.data.surgical.index import build_index
    from fedmedbench.data.surgical.schema import read_index

    root = tmp_path_factory.mktemp("uf")
    cfg, _ = F.make(root / "raw", "cholectrack20")
    build_index("cholectrack20", cfg, root / "raw", root / "idx", log=lambda m: None)
    df, meta = read_index(root / "idx")
    group = {"datasets": ["cholectrack20"], "num_clients": 3, "seed": 0,
             "exclude_videos": {"cholectrack20": ["VID30", "VID31"]}, "video_splits": {"cholectrack20": F.CT20_SPLITS},
             "settings": {"a": {"scheme": "iid"}}}
    g = R.build_group("g", {"cholectrack20": df}, {"cholectrack20": meta}, group, F.TOOL_GROUPS)
    write_group(g, root / "group", "synthetic")
    export_group(root / "group", root / "yolo")
    return root / "yolo" / "a" / "manifest.json"


@pytest.fixture(scope="module")
def coco_like(tmp_path_factory):
    """A stand-in for COCO yolo11n.pt: Ultralytics' own checkpoint of an 80-class YOLO11n (random weights)."""
    from ultralytics import YOLO

    path = tmp_path_factory.mktemp("coco") / "yolo11n.pt"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(80)
        YOLO("yolo11n.yaml").save(path)
    return path


def _spec(export, tmp_path, strategy, rounds=2, weights=None, **mp):
    spec = RunSpec(run_dir=str(tmp_path / strategy), study="ultraflwr", dataset="g", setting="a", method="ultraflwr",
                   seed=0, partition_path=str(export), sources={}, image_size=64, model="yolo11n.yaml",
                   pretrained_path=None if weights is None else str(weights),
                   train={"rounds": rounds, "local_epochs": 1, "batch_size": 8, "lr": 0.01},
                   method_params={"strategy": strategy, **mp}, task="detection", device="cpu")
    return fed.resolve_data_shapes(spec)


def test_trainer_uses_our_weights_and_returns_fp32_validated_ema(export, tmp_path, monkeypatch):
    """The model handed in is trained (not rebuilt), weights come back in fp32 from the selected epoch;
    on a CPU the trainer runs no full garbage collection (Ultralytics' is for accelerator memory)."""
    import gc

    from fedmedbench.fl.tasks.detection.task import DetectionTask

    collections = []
    monkeypatch.setattr(gc, "collect", lambda *a, **k: collections.append(a) or 0)

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = train_yolo(model, data.data_yaml, epochs=2, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
                     workdir=tmp_path / "w", select="best")
    assert set(out.state) == set(before)
    assert all(v.dtype == torch.float32 for v in out.state.values() if v.is_floating_point())
    assert len(out.val_map50) == 2 and 0 <= out.selected_epoch < 2
    # started from OUR weights: the frozen DFL projection is untouched, BN counters kept counting from ours
    assert torch.equal(out.state["model.23.dfl.conv.weight"], before["model.23.dfl.conv.weight"])
    changed = [k for k in before if before[k].is_floating_point() and not torch.equal(before[k], out.state[k])]
    params = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(changed) & params  # weights moved, not only BN statistics (two epochs of one batch each)
    assert not list((tmp_path / "w").rglob("*.pt"))  # no fp16 checkpoints written
    assert not list(export.parent.rglob("*.cache"))  # label caches stay in the run's stage
    assert collections == []


class _Recording(fed.InProcessTransport):
    """Records, after each round's training, the model each client kept in its persistent state."""

    def __init__(self, spec, federation):
        super().__init__(spec)
        self.federation, self.kept = federation, {}

    def train(self, rnd, steps, arrays, broadcast):
        out = super().train(rnd, steps, arrays, broadcast)
        self.kept[rnd] = {p: self.federation.store.load(p, before_round=rnd + 1)["model"] for p in steps}
        return out


@pytest.fixture(scope="module")
def partial_run(export, coco_like, tmp_path_factory):
    """One uninterrupted 2-round FedBackboneNeckAvg run from start weights with an 80-class head, so each client's
    class branches restart under its own seed in round 1 (shared by the PA and resume tests)."""
    spec = _spec(export, tmp_path_factory.mktemp("pa"), "FedBackboneNeckAvg", rounds=2, weights=coco_like)
    f = fed.Federation(spec, log=lambda m: None)
    transport = _Recording(spec, f)
    state = f.run(transport)
    return spec, f, state, transport.kept


def test_partial_run_keeps_local_components_bit_identical(partial_run):
    """FedBackboneNeckAvg: after aggregation the head of each client is exactly its own; the
    aggregated components equal the FedAvg mean (equal client weights, the default); the last round
    uploads nothing (omitted)."""
    from fedmedbench.fl.methods.ultraflwr import fedavg_weights

    spec, f, state, kept = partial_run
    method = get_method("ultraflwr", spec.method_params)
    model = fed.new_model(spec)
    head = C.component_keys(model, "ultraflwr")["head"]
    shared = method.shared_keys(model)
    assert not set(head) & set(shared)
    r1 = kept[1]
    for p in range(3):
        ctx, _ = fed._client_context(f.job, p, 3, state.arrays, steps=0)  # as client_evaluate after round 2
        personal = method.personal_model(ctx).state_dict()
        # final aggregation omitted: the client's own round-2 model, everything included
        r2 = kept[2][p]
        assert all(torch.equal(personal[k], r2[k]) for k in r2)
    # round-1 aggregation: shared keys = the mean of what clients trained, head not touched
    assert method.weighting == "uniform"
    weights = np.array(fedavg_weights(f.task.client_sizes(), method.weighting))
    k = shared[0]
    expected = sum(w * r1[p][k].numpy().astype(np.float64) for p, w in enumerate(weights / weights.sum()))
    rows = state.server_state["ultraflwr_clients"]
    assert [r["bytes_sent"] > 0 for r in rows] == [True] * 3 + [False] * 3
    assert rows[0]["elements_sent"] == sum(r1[0][k].numel() for k in shared)
    assert np.allclose(state.arrays[k], expected, atol=1e-6)
    # the client's head after round 1 == its own trained head (not averaged with the others)
    restored, _ = fed._client_context(f.job, 1, 2, state.arrays, steps=0)
    restored.state = {"model": r1[1]}
    method._restore_own(restored, everything=False)
    sd = restored.model.state_dict()
    assert all(torch.equal(sd[h], r1[1][h]) for h in head)
    assert all(np.array_equal(sd[s].numpy(), state.arrays[s]) for s in shared)
    assert not torch.equal(r1[0][head[-2]], r1[1][head[-2]])  # clients' heads really differ
    client_rows = json.loads(json.dumps(state.client_rows))
    row = client_rows[1]  # row 1 of the ID/CD matrix: client 1's model on every client's test split
    assert {"test0_map50", "test1_map50", "test2_map50", "local_map50", "cd_map50"} <= set(row)
    assert row["local_map50"] == row["test1_map50"]
    assert row["cd_map50"] == pytest.approx((row["test0_map50"] + row["test2_map50"]) / 2)


class _Killed(Exception):
    pass


class _CrashAt(fed.InProcessTransport):
    """Stands for a job killed after round ``rnd - 1`` was checkpointed."""

    def __init__(self, spec, rnd):
        super().__init__(spec)
        self.rnd = rnd

    def train(self, rnd, steps, arrays, broadcast):
        if rnd == self.rnd:
            raise _Killed(f"killed before round {rnd}")
        return super().train(rnd, steps, arrays, broadcast)


def test_resumed_partial_run_is_bit_identical(partial_run, export, coco_like, tmp_path):
    """A PA run stopped after round 1 and resumed from its checkpoint ends with the same global
    arrays, the same per-client kept models (head never aggregated, started under each client's
    seed) and the same metrics as the uninterrupted run: the non-aggregated components survive
    the restart bit for bit."""
    ref_spec, ref_fed, ref_state, _ = partial_run
    spec = _spec(export, tmp_path, "FedBackboneNeckAvg", rounds=2, weights=coco_like)
    assert spec.run_hash() == ref_spec.run_hash()
    with pytest.raises(_Killed):
        fed.Federation(spec, log=lambda m: None).run(_CrashAt(spec, 2))
    logged: list[str] = []
    f = fed.Federation(spec, log=logged.append)
    state = f.run(fed.InProcessTransport(spec))
    assert any("resuming from checkpoint at round 1/2" in m for m in logged)
    assert state.round == ref_state.round == 2
    assert set(state.arrays) == set(ref_state.arrays)
    assert all(np.array_equal(state.arrays[k], ref_state.arrays[k]) for k in ref_state.arrays)
    for p in range(3):
        mine, ref = f.store.load(p, before_round=3)["model"], ref_fed.store.load(p, before_round=3)["model"]
        assert set(mine) == set(ref) and all(torch.equal(mine[k], ref[k]) for k in ref)
    import pandas as pd

    def frame(rows):  # NaN-aware comparison; wall time differs by nature
        return pd.DataFrame(rows).drop(columns=["elapsed_s"], errors="ignore")

    pd.testing.assert_frame_equal(frame(state.rows), frame(ref_state.rows), check_exact=True)
    pd.testing.assert_frame_equal(frame(state.client_rows), frame(ref_state.client_rows), check_exact=True)
    pd.testing.assert_frame_equal(frame(state.server_state["ultraflwr_clients"]),
                                  frame(ref_state.server_state["ultraflwr_clients"]), check_exact=True)


@pytest.mark.parametrize("select", ["best", "last"])
def test_select_captures_the_chosen_epochs_weights(export, tmp_path, monkeypatch, select):
    """select=best: the EMA weights of the last epoch with the highest Ultralytics 8.3 fitness (ties
    included, as best.pt); select=last: those of the last epoch (recorded independently at every epoch end)."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    from fedmedbench.fl.tasks.detection import yolo as Y
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    epochs: list[tuple[float, dict, float]] = []
    init = DetectionTrainer.__init__

    def recording_init(self, *a, **kw):
        init(self, *a, **kw)

        def record(tr):
            m50 = float((tr.metrics or {}).get("metrics/mAP50(B)", float("nan")))
            epochs.append((m50, Y._fp32_copy(tr.ema.ema.state_dict()), Y.selection_score(tr.metrics or {}, "fitness")))

        self.add_callback("on_fit_epoch_end", record)  # registered before train_yolo's own callback

    monkeypatch.setattr(DetectionTrainer, "__init__", recording_init)
    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=5)
    # nbs = batch, no warm-up: an optimizer step every batch, so each epoch's EMA weights differ
    # (Ultralytics' nominal batch 64 would accumulate over the few tiny test images)
    out = train_yolo(model, data.data_yaml, epochs=2, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
                     workdir=tmp_path / "w", select=select, extra={"nbs": 8, "warmup_epochs": 0})
    assert len(epochs) == 2
    if select == "last":
        expected = 1
        assert np.isnan(out.val_map50[0]) and not np.isnan(out.val_map50[1])  # only the final epoch validated
    else:
        m, score = [e[0] for e in epochs], [e[2] for e in epochs]
        expected = max(i for i, v in enumerate(score) if v == max(score))  # the last epoch reaching the maximum
        assert out.val_map50 == pytest.approx(m)
    assert out.selected_epoch == expected
    assert all(torch.equal(out.state[k], epochs[expected][1][k]) for k in out.state)
    other = epochs[1 - expected][1]
    assert any(not torch.equal(out.state[k], other[k]) for k in out.state)  # the epochs' weights really differ


class _FakeTrainer:
    """What EpochSelector reads from an Ultralytics trainer at an epoch's end."""

    def __init__(self, epoch, epochs, m50, m5095):
        self.epoch, self.epochs, self.stop, self.validated_epoch = epoch, epochs, False, epoch
        self.metrics = {"metrics/mAP50(B)": m50, "metrics/mAP50-95(B)": m5095}
        self.ema = type("E", (), {"ema": torch.nn.Linear(1, 1, bias=False)})()
        torch.nn.init.constant_(self.ema.ema.weight, float(epoch))  # the weights name their epoch


@pytest.mark.parametrize("metric,expected", [("map50", 1), ("fitness", 2)])
def test_select_metric_map50_vs_ultralytics_fitness_pick_different_epochs(metric, expected):
    """Hand-made validation results: epoch 1 has the best mAP50 (0.60), epoch 2 the best Ultralytics 8.3
    fitness 0.1 mAP50 + 0.9 mAP50-95 (0.055 + 0.27 = 0.325 vs 0.06 + 0.18 = 0.24): the paper's text keeps
    epoch 1, UltraFlwr's best.pt epoch 2; the kept weights are that epoch's."""
    from fedmedbench.fl.tasks.detection.yolo import EpochSelector, selection_score

    results = [(0.30, 0.10), (0.60, 0.20), (0.55, 0.30), (0.20, 0.05)]
    sel = EpochSelector("best", metric)
    for e, (m50, m5095) in enumerate(results):
        sel(_FakeTrainer(e, len(results), m50, m5095))
    assert sel.epoch == expected and float(sel.state["weight"]) == expected
    assert sel.curve == [r[0] for r in results]
    assert selection_score({"metrics/mAP50(B)": 0.55, "metrics/mAP50-95(B)": 0.30}, "fitness") == pytest.approx(0.325)
    last = EpochSelector("last", metric)
    for e, (m50, m5095) in enumerate(results):
        last(_FakeTrainer(e, len(results), m50, m5095))
    assert last.epoch == 3
    with pytest.raises(ValueError, match="select_metric"):
        EpochSelector("best", "map50_95")


@pytest.mark.parametrize("metric", ["fitness", "map50"])
def test_select_keeps_the_last_of_tied_epochs_as_ultralytics_best_pt(metric):
    """Three epochs with the same validation results: Ultralytics writes best.pt whenever an epoch's fitness
    equals the best so far (8.3.48 and 8.4 ``engine/trainer.py``: ``best_fitness == fitness``), so the
    reference's best.pt holds the last of the tied epochs: epoch 2's weights."""
    from fedmedbench.fl.tasks.detection.yolo import EpochSelector

    sel = EpochSelector("best", metric)
    for e in range(3):
        sel(_FakeTrainer(e, 3, 0.4, 0.2))
    assert sel.epoch == 2 and float(sel.state["weight"]) == 2.0


@pytest.mark.parametrize("weighting,expected", [("frames", 0.25 * 1 + 0.75 * 5), ("uniform", 3.0)])
def test_fedavg_weighting_frames_vs_uniform(weighting, expected):
    """FedAvg by training frames (McMahan) vs equal weights (UltraFlwr's clients all report 10 examples)."""
    from fedmedbench.fl.api.arrays import weighted_average
    from fedmedbench.fl.methods.ultraflwr import fedavg_weights

    arrays = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([5.0])}]
    out = weighted_average(arrays, fedavg_weights([100, 300], weighting))
    assert float(out["w"][0]) == pytest.approx(expected)
    with pytest.raises(ValueError, match="weighting"):
        fedavg_weights([1, 2], "examples")


def test_defaults_follow_ultraflwrs_code():
    """Unless configured otherwise, a run does what UltraFlwr's code does: FedAvg gives every client the
    same weight (its clients all report 10 examples) and the local model is the epoch of best Ultralytics
    8.3 fitness (its best.pt); the paper's text (mAP50) and McMahan's frame weighting are options."""
    from pathlib import Path

    import yaml

    from fedmedbench.fl.tasks.detection.yolo import EpochSelector

    method = get_method("ultraflwr", {"strategy": "FedAvg"})
    assert (method.select_metric, method.weighting) == ("fitness", "uniform")
    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "schema.yaml").read_text())
    train = schema["properties"]["ultraflwr"]["properties"]["train"]["properties"]
    assert (train["select_metric"]["default"], train["weighting"]["default"]) == ("fitness", "uniform")
    assert schema["properties"]["ultraflwr"]["properties"]["model"]["properties"]["head_init"]["default"] == "client"
    assert method.head_init == "client"
    assert train["warmup"]["default"] == method.warmup == "ultralytics_8_3"  # UltraFlwr pins Ultralytics 8.3.48
    assert train["assigner"]["default"] == method.assigner == "ultralytics_8_3"
    assert train["hsv"]["default"] == method.hsv == "ultralytics_8_3"
    assert train["ap"]["default"] == method.ap == "ultralytics_8_3"
    assert train["match"]["default"] == method.match == "ultralytics_8_3"
    assert train["pipeline"]["default"] == method.pipeline == "ultralytics_8_3"
    sel = EpochSelector()  # the hand-made results above: best mAP50 at epoch 1, best fitness at epoch 2
    for e, (m50, m5095) in enumerate([(0.30, 0.10), (0.60, 0.20), (0.55, 0.30), (0.20, 0.05)]):
        sel(_FakeTrainer(e, 4, m50, m5095))
    assert sel.epoch == 2
    model = build_yolo("yolo11n.yaml", 3, seed=0)
    keys, results = _results(method, model)  # clients of 1, 2 and 7 training frames
    ctx = ServerContext(rnd=1, global_arrays={}, results=results, pids=[0, 1, 2], state={}, num_clients=3,
                        device=torch.device("cpu"), train=TrainConfig(rounds=3, local_epochs=1, batch_size=8, lr=0.01),
                        new_model=lambda: model)
    new = method.aggregate(ctx)
    np.testing.assert_allclose(new[keys[0]], np.mean([r.arrays[keys[0]] for r in results], 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("iterations,expected", [(20_000, ("SGD", 0.01)), (10_000, ("AdamW", 0.000909))])
def test_auto_optimizer_follows_ultralytics_83(iterations, expected):
    """optimizer=auto as UltraFlwr's pinned Ultralytics 8.3.48 chose it: plain SGD (Nesterov, lr 0.01) above
    10,000 iterations (the 400-epoch centralized baseline), AdamW at 0.002 * 5 / (4 + nc) otherwise, bias
    warm-up from 0; ``installed`` leaves the choice to the installed Ultralytics (8.4: MuSGD for SGD)."""
    from types import SimpleNamespace

    from ultralytics.models.yolo.detect import DetectionTrainer

    from fedmedbench.fl.tasks.detection.yolo import study_trainer

    def build(cls):
        trainer = cls.__new__(cls)
        trainer.args = SimpleNamespace(optimizer="auto", lr0=0.01, momentum=0.937, warmup_bias_lr=0.1)
        trainer.data = {"nc": 7}
        opt = trainer.build_optimizer(build_yolo("yolo11n.yaml", 7, seed=0), name="auto", lr=0.01, momentum=0.937,
                                      decay=5e-4, iterations=iterations)
        return trainer, opt

    trainer, opt = build(study_trainer())
    assert type(opt) is getattr(torch.optim, expected[0])
    assert {g["lr"] for g in opt.param_groups} == {expected[1]}
    assert (trainer.args.optimizer, trainer.args.lr0, trainer.args.warmup_bias_lr) == (*expected, 0.0)
    if expected[0] == "SGD":
        assert all(g["nesterov"] and g["momentum"] == 0.9 for g in opt.param_groups)
    _, installed = build(study_trainer("installed"))
    _, theirs = build(DetectionTrainer)
    assert type(installed) is type(theirs)
    with pytest.raises(ValueError, match="auto_optimizer"):
        study_trainer("ultralytics_8_2")


@pytest.mark.parametrize("warmup_epochs,batches,epochs,ours,installed", [(3.0, 4, 2, 100, 4), (3.0, 40, 20, 120, 120),
                                                                      (3.0, 20, 20, 100, 60), (0.0, 4, 2, -1, 0)])
def test_warmup_length_follows_ultralytics_83(warmup_epochs, batches, epochs, ours, installed):
    """The learning rate warms up over max(warmup_epochs x batches, 100) iterations as in UltraFlwr's Ultralytics
    8.3.48 (engine/trainer.py:325); ``installed`` keeps 8.4's min(warmup_epochs, epochs - 1) epochs of batches."""
    from types import SimpleNamespace

    from fedmedbench.fl.tasks.detection.yolo import study_trainer, warmup_iterations_83

    def length(cls):
        trainer = cls.__new__(cls)
        trainer.args, trainer.epochs = SimpleNamespace(warmup_epochs=warmup_epochs), epochs
        return trainer._get_warmup_iterations(batches)

    assert warmup_iterations_83(warmup_epochs, batches) == ours == length(study_trainer())
    assert length(study_trainer(warmup="installed")) == installed
    with pytest.raises(ValueError, match="warmup"):
        study_trainer(warmup="ultralytics_8_2")
    with pytest.raises(ValueError, match=r"method_params\.ultraflwr\.warmup: .none.: choose one of"):
        get_method("ultraflwr", {"warmup": "none"})


def test_a_short_training_of_a_small_client_moves_its_weights_only_with_83s_warmup(export, tmp_path):
    """Two epochs of one batch: with 8.4's warm-up (one epoch of batches) the only optimizer step falls on its
    first iteration, at learning rate 0, and no weight moves; 8.3.48's (100 iterations) steps every batch."""
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    moved = {}
    for warmup in ("ultralytics_8_3", "installed"):
        model = build_yolo("yolo11n.yaml", spec.num_classes, seed=5)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        out = train_yolo(model, data.data_yaml, epochs=2, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
                         workdir=tmp_path / warmup, select="last", warmup=warmup)
        moved[warmup] = sum(not torch.equal(out.state[n], p) for n, p in before.items())
    assert moved["installed"] == 0 and moved["ultralytics_8_3"] > 0.9 * len(before)


def test_candidate_anchors_follow_ultralytics_83():
    """8.3.48 lets an anchor take a box only when its centre lies inside the box; 8.4 first widens a box narrower or
    shorter than 16 px to 16 px. On an 8 x 8 px box the two differ; on boxes of 16 px or more they agree."""
    from ultralytics.utils.tal import TaskAlignedAssigner

    from fedmedbench.fl.tasks.detection.yolo import anchors_in_boxes_83

    centres = torch.tensor([[12.0, 12.0], [20.0, 20.0], [4.0, 4.0], [30.0, 30.0]])
    small = torch.tensor([[[10.0, 10.0, 18.0, 18.0]]])
    installed = TaskAlignedAssigner(topk=10, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    assert anchors_in_boxes_83(centres, small).tolist() == [[[True, False, False, False]]]
    assert installed.select_candidates_in_gts(centres, small, torch.ones(1, 1, 1)).tolist() == [[[True, True, False, False]]]
    gen = torch.Generator().manual_seed(0)
    grid = torch.stack(torch.meshgrid(torch.arange(4.0, 200, 8), torch.arange(4.0, 200, 8), indexing="xy"), -1).view(-1, 2)
    corner = torch.rand(2, 5, 2, generator=gen) * 120
    large = torch.cat((corner, corner + 16 + torch.rand(2, 5, 2, generator=gen) * 60), -1)
    assert torch.equal(anchors_in_boxes_83(grid, large), installed.select_candidates_in_gts(grid, large, torch.ones(2, 5, 1)))


@pytest.mark.parametrize("assigner", ["ultralytics_8_3", "installed"])
def test_the_trained_models_loss_assigns_targets_by_the_chosen_rule(export, tmp_path, assigner):
    from ultralytics.utils.tal import TaskAlignedAssigner

    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=5)
    train_yolo(model, data.data_yaml, epochs=1, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
               workdir=tmp_path / "w", select="last", assigner=assigner)
    rule = type(model.criterion.assigner).select_candidates_in_gts
    assert (rule is TaskAlignedAssigner.select_candidates_in_gts) == (assigner == "installed")
    with pytest.raises(ValueError, match=r"method_params\.ultraflwr\.assigner: .none.: choose one of"):
        get_method("ultraflwr", {"assigner": "none"})


def test_hue_augmentation_follows_ultralytics_83():
    """8.3.48 scales OpenCV's hue (0..179) by the drawn factor 1 + u * hsv_h, modulo 180; 8.4 shifts it by
    u * hsv_h * 180. One uniform triple is drawn per image either way."""
    import cv2
    from ultralytics.data.augment import RandomHSV

    from fedmedbench.fl.tasks.detection.hsv import RandomHSV83, hue_lut_83

    assert hue_lut_83(1.5)[[0, 100, 130, 179]].tolist() == [0, 150, 15, 88]  # 130 x 1.5 = 195 -> 15
    hsv = np.array([[[5, 200, 200], [100, 200, 200], [170, 200, 200]]], np.uint8)
    img = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    np.random.seed(0)
    u = np.random.uniform(-1, 1, 3)[0]  # 0.0976...
    want_hsv = hsv.copy()
    want_hsv[..., 0] = (hsv[..., 0].astype(np.float64) * (1 + 0.5 * u) % 180).astype(np.uint8)
    want = cv2.cvtColor(want_hsv, cv2.COLOR_HSV2BGR)
    outputs = {}
    for name, cls in (("8.3", RandomHSV83), ("8.4", RandomHSV)):
        np.random.seed(0)
        labels = cls(hgain=0.5, sgain=0.0, vgain=0.0)({"img": img.copy()})
        outputs[name] = labels["img"]
        assert np.random.uniform() == pytest.approx(np.random.RandomState(0).uniform(size=4)[3])  # 3 draws used
    assert np.array_equal(outputs["8.3"], want)
    assert not np.array_equal(outputs["8.4"], want)


def test_the_training_set_takes_its_hsv_step_by_the_chosen_rule_also_after_the_mosaic_closes(monkeypatch):
    from types import SimpleNamespace

    from ultralytics.data.augment import Compose, RandomHSV
    from ultralytics.models.yolo.detect import DetectionTrainer

    from fedmedbench.fl.tasks.detection.hsv import RandomHSV83, with_83_hue
    from fedmedbench.fl.tasks.detection.yolo import study_trainer

    def stub(self, img_path, mode="train", batch=None):
        ds = SimpleNamespace(build_transforms=lambda hyp: Compose([RandomHSV(0.1, 0.2, 0.3), "format"]), imgsz=64)
        ds.transforms = ds.build_transforms(None)
        return ds

    monkeypatch.setattr(DetectionTrainer, "build_dataset", stub)
    for hsv, mode, swapped in (("ultralytics_8_3", "train", True), ("ultralytics_8_3", "val", False),
                               ("installed", "train", False)):
        cls = study_trainer(hsv=hsv)
        ds = cls.build_dataset(cls.__new__(cls), "images", mode)
        for built in (ds.transforms, ds.build_transforms(None)):  # the first list, and the one close_mosaic builds
            step = built.transforms[0]
            assert type(step) is (RandomHSV83 if swapped else RandomHSV)
            assert (step.hgain, step.sgain, step.vgain) == (0.1, 0.2, 0.3) and built.transforms[1] == "format"
    with pytest.raises(ValueError, match=r"method_params\.ultraflwr\.hsv: .none.: choose one of"):
        get_method("ultraflwr", {"hsv": "none"})
    import pickle  # dataloader workers started by spawn or forkserver receive the dataset pickled

    built = pickle.loads(pickle.dumps(with_83_hue(Compose([RandomHSV(0.1, 0.2, 0.3)]))))
    assert type(built.transforms[0]) is RandomHSV83 and built.transforms[0].vgain == 0.3


def _validated_trainer(cls, monkeypatch, m50, m5095, patience=100):
    """A trainer of ``cls`` set up (the base class's setup stubbed) and validated once by a validator
    stub returning Ultralytics 8.4's metrics dict (its ``fitness`` = mAP50-95)."""
    from types import SimpleNamespace

    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.utils.torch_utils import EarlyStopping

    def setup(self):
        self.stopper, self.stop = EarlyStopping(patience=self.args.patience), False

    monkeypatch.setattr(DetectionTrainer, "_setup_train", setup)
    trainer = cls.__new__(cls)
    trainer.args = SimpleNamespace(patience=patience)
    trainer.model, trainer.ema, trainer.world_size, trainer.best_fitness, trainer.epoch = None, None, 1, None, 0
    trainer.loss = torch.tensor(1.0)  # Ultralytics evaluates its loss fallback even when metrics have a fitness
    trainer.validator = lambda tr: {"metrics/mAP50(B)": m50, "metrics/mAP50-95(B)": m5095, "fitness": m5095}
    trainer._setup_train()
    trainer.metrics, trainer.fitness = trainer.validate()
    return trainer


def test_early_stopping_reads_ultralytics_83_fitness(monkeypatch):
    """The fitness the trainer hands its early stopping (and keeps as best_fitness) is Ultralytics 8.3.48's
    0.1 mAP50 + 0.9 mAP50-95 (0.1 * 0.8 + 0.9 * 0.5 = 0.53), not 8.4's mAP50-95 alone (0.5);
    ``fitness="installed"`` keeps 8.4's."""
    from fedmedbench.fl.tasks.detection.yolo import EarlyStopping83, study_trainer

    trainer = _validated_trainer(study_trainer(), monkeypatch, 0.8, 0.5)
    assert trainer.fitness == pytest.approx(0.53) and trainer.best_fitness == pytest.approx(0.53)
    assert isinstance(trainer.stopper, EarlyStopping83)
    assert not trainer.stopper(1, trainer.fitness) and trainer.stopper.best_fitness == pytest.approx(0.53)
    assert trainer.validated_epoch == 0
    installed = _validated_trainer(study_trainer(fitness="installed"), monkeypatch, 0.8, 0.5)
    assert not isinstance(installed.stopper, EarlyStopping83)
    assert installed.fitness == pytest.approx(0.5) and installed.best_fitness == pytest.approx(0.5)
    with pytest.raises(ValueError, match="fitness"):
        study_trainer(fitness="ultralytics_8_2")


def test_early_stopping_counts_an_equal_fitness_as_improvement_as_ultralytics_83():
    """Patience 2 on the fitness sequence 0.5, 0.5, 0.4, 0.4, 0.4: Ultralytics 8.3.48 (``>=``) takes epoch 2
    as the best and stops at epoch 4; 8.4 (strict ``>``) keeps epoch 1 and stops at epoch 3."""
    from ultralytics.utils.torch_utils import EarlyStopping

    from fedmedbench.fl.tasks.detection.yolo import EarlyStopping83

    def stop_epoch(stopper):
        return next(e for e, f in enumerate([0.5, 0.5, 0.4, 0.4, 0.4], start=1) if stopper(e, f))

    ours = EarlyStopping83(patience=2)
    assert stop_epoch(ours) == 4 and ours.best_epoch == 2
    assert stop_epoch(EarlyStopping(patience=2)) == 3
    assert not EarlyStopping83(patience=2)(1, None)


@pytest.mark.parametrize("final", ["skip_all", "skip_partial", "keep"])
def test_final_aggregation_options(monkeypatch, final):
    """What the last round uploads and which model each client is evaluated with afterwards:
    skip_all -> nothing sent, own model; skip_partial -> only PA strategies skip; keep -> all send,
    the aggregated components then come from the server."""
    from types import SimpleNamespace

    from fedmedbench.fl.api import ClientContext
    from fedmedbench.fl.api.arrays import load_arrays
    from fedmedbench.fl.tasks.detection import yolo as Y

    base = build_yolo("yolo11n.yaml", 3, seed=0)
    own = {k: (v + 1.0 if v.is_floating_point() else v.clone()) for k, v in base.state_dict().items()}
    monkeypatch.setattr(Y, "train_yolo", lambda *a, **kw: Y.TrainOutcome(state=own, selected_epoch=0, val_map50=[0.0]))
    train = TrainConfig(rounds=2, local_epochs=1, batch_size=8, lr=0.01)
    data = SimpleNamespace(data_yaml="unused.yaml", imgsz=64, seed=0, workdir="unused", num_train=5, read_ahead=False, pixel_thread=False)
    expected_skip = {"skip_all": {"FedAvg": True, "FedHeadAvg": True},
                     "skip_partial": {"FedAvg": False, "FedHeadAvg": True},
                     "keep": {"FedAvg": False, "FedHeadAvg": False}}[final]
    for strategy, skip in expected_skip.items():
        method = get_method("ultraflwr", {"strategy": strategy, "final_aggregation": final})
        assert method.skips_final() is skip
        shared = method.shared_keys(base)
        glob = {k: base.state_dict()[k].clone() for k in shared}

        def ctx(rnd, state, glob=glob, shared=shared):
            model = build_yolo("yolo11n.yaml", 3, seed=0)
            load_arrays(model, glob, shared)
            return ClientContext(pid=0, rnd=rnd, model=model, data=data, train=train, device=torch.device("cpu"),
                                 generator=torch.Generator(), state=state, steps=0, global_arrays=glob)

        assert set(method.client_fit(ctx(1, {})).arrays) == set(shared)  # earlier rounds always send
        last = method.client_fit(ctx(2, {}))
        assert set(last.arrays) == (set() if skip else set(shared))
        assert last.metrics["bytes_sent"] == (0 if skip else 4 * sum(own[k].numel() for k in shared))
        personal = method.personal_model(ctx(3, {"model": own})).state_dict()  # evaluation after the last round
        for k, v in own.items():
            from_server = k in shared and not skip
            assert torch.equal(personal[k], base.state_dict()[k] if from_server else v), (strategy, k)


@pytest.mark.parametrize("head_init", ["client", "common"])
def test_head_init_restarts_what_the_start_weights_do_not_supply(coco_like, monkeypatch, head_init):
    """Round 1 from 80-class start weights for 3 classes: every tensor the weights supply is theirs on every
    client; the rest (the class branches, as the loader reports) is, with ``client``, a fresh build under
    that client's own seed (UltraFlwr's trainer rebuilds the model under seed=cid), so two clients' differ;
    with ``common`` it is the server's one init on both."""
    from types import SimpleNamespace

    from fedmedbench.fl.api import ClientContext
    from fedmedbench.fl.api.arrays import load_arrays
    from fedmedbench.fl.tasks.detection import yolo as Y
    from fedmedbench.weights.models import read_yolo_checkpoint

    started: dict[int, dict[str, torch.Tensor]] = {}

    def fake_train(model, *a, seed, **kw):
        started[seed] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return Y.TrainOutcome(state=started[seed], selected_epoch=0, val_map50=[0.0])

    monkeypatch.setattr(Y, "train_yolo", fake_train)
    train = TrainConfig(rounds=2, local_epochs=1, batch_size=8, lr=0.01)
    server = build_yolo("yolo11n.yaml", 3, seed=0, weights=str(coco_like))
    unsupplied = server.yolo_start.unsupplied(server.state_dict())
    assert unsupplied == server.yolo_start.report.head_reinitialised  # nothing else is left out of the file
    assert "model.23.cv3.0.2.weight" in unsupplied and all(k.startswith("model.23.cv3.") for k in unsupplied)

    def ctx(method, pid, seed, rnd=1):
        shared = method.shared_keys(server)
        model = build_yolo("yolo11n.yaml", 3, seed=0, weights=str(coco_like))
        load_arrays(model, {k: server.state_dict()[k].numpy() for k in shared}, shared)
        data = SimpleNamespace(data_yaml="unused.yaml", imgsz=64, seed=seed, workdir="unused", num_train=5, read_ahead=False, pixel_thread=False)
        return ClientContext(pid=pid, rnd=rnd, model=model, data=data, train=train, device=torch.device("cpu"),
                             generator=torch.Generator(), state={}, steps=0)

    method = get_method("ultraflwr", {"strategy": "FedAvg", "head_init": head_init})
    assert method.head_init == head_init
    for pid, seed in ((0, 3), (1, 4)):  # seed set 1: clients 0 and 1
        method.client_fit(ctx(method, pid, seed))
    served = read_yolo_checkpoint(coco_like)
    for seed, state in started.items():
        assert all(torch.equal(state[k], served[k]) for k in state if k not in unsupplied)
        fresh = build_yolo("yolo11n.yaml", 3, seed=seed if head_init == "client" else 0).state_dict()
        assert all(torch.equal(state[k], fresh[k]) for k in unsupplied)
    convs = [k for k in unsupplied if started[3][k].dim() == 4]
    assert convs
    differ = [k for k in unsupplied if not torch.equal(started[3][k], started[4][k])]
    assert differ == (convs if head_init == "client" else [])  # BN and class biases start alike by construction
    if head_init == "client":  # a client first trained after round 1 keeps what the server aggregated
        assert method._own_head_init(ctx(method, 2, 5, rnd=2)) == []
        pa = get_method("ultraflwr", {"strategy": "FedBackboneNeckAvg"})
        assert pa._own_head_init(ctx(pa, 2, 5, rnd=2)) == unsupplied
    with pytest.raises(ValueError, match="head_init"):
        get_method("ultraflwr", {"strategy": "FedAvg", "head_init": "server"})


def test_a_fresh_build_under_a_seed_is_the_model_ultralytics_trainer_builds(export, tmp_path):
    """What ``head_init: client`` gives a client is what Ultralytics' trainer builds after seeding itself
    with the client's seed (init_seeds, then get_model for the data's nc), before it loads weights."""
    from fedmedbench.fl.tasks.detection.task import DetectionTask
    from fedmedbench.fl.tasks.detection.yolo import study_trainer

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(1)
    args = dict(model="yolo11n.yaml", data=data.data_yaml, seed=data.seed, deterministic=True, device="cpu",
                workers=0, project=str(tmp_path / "t"), name="t", exist_ok=True, plots=False, save=False, verbose=False)
    theirs = study_trainer()(overrides=args).get_model(cfg="yolo11n.yaml", weights=None, verbose=False).state_dict()
    ours = build_yolo("yolo11n.yaml", spec.num_classes, seed=data.seed).state_dict()
    assert set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_centralized_start_seed_follows_head_init():
    """The centralized baseline builds each client's model under that client's seed (``client``; the
    trainer's rebuild) or under the run's seed (``common``), then loads the start weights."""
    from types import SimpleNamespace

    from fedmedbench.fl.tasks.detection.centralized import start_seed

    spec = SimpleNamespace(seed=1)
    assert (start_seed(spec, 4, "client"), start_seed(spec, 4, "common")) == (4, 1)
    with pytest.raises(ValueError, match="head_init"):
        start_seed(spec, 4, "none")


# ----------------------------------------------------------------------------- report (hand-made run outputs)

_OFFSETS = {0: [0.0, 0.1, 0.2], 1: [0.05, 0.15, 0.25]}  # per seed set, clients 0-2: mean +0.125, std (ddof=1) 0.0935
_SPREAD = {0: (0.04, -0.04), 1: (-0.06, 0.06), 2: (0.02, -0.02)}  # per client: its two CD pairs differ, mean 0


def _pair_columns(c: int, local: float, cd: float) -> dict:
    """Row c of the ID/CD matrix: own test split ``local``; the two others ``cd`` +- a spread (mean ``cd``)."""
    others = [j for j in range(3) if j != c]
    row = {f"test{c}_map50": local, f"test{c}_map50_95": local / 2}
    for j, d in zip(others, _SPREAD[c], strict=True):
        row[f"test{j}_map50"], row[f"test{j}_map50_95"] = cd + d, (cd + d) / 2
    return row


def _client_csv(path, base, cd_shift=-0.1, rounds=2, early=0.99):
    """Final round: ID = base + offset, CD pairs average ID + cd_shift; earlier rounds: ``early`` (ignored)."""
    import pandas as pd

    rows = []
    for seed, off in _OFFSETS.items():
        for r in range(1, rounds + 1):
            for c, o in enumerate(off):
                v = base + o if r == rounds else early
                rows.append({"seed": seed, "round": r, "client": c, **_pair_columns(c, v, v + cd_shift)})
    df = pd.DataFrame(rows)
    out = {}
    for seed in _OFFSETS:
        p = path / f"seed{seed}_clients.csv"
        df[df["seed"] == seed].drop(columns="seed").to_csv(p, index=False)
        out[seed] = p
    return out


def _runs(tmp_path):
    import pandas as pd

    runs = []
    bases = {"a": {"FedAvg": 0.5, "FedMedian": 0.6, "FedHeadAvg": 0.55, "FedNeckAvg": 0.3, "Centralized": 0.45},
             "b": {"FedAvg": 0.4, "FedMedian": 0.4, "FedHeadAvg": 0.2, "FedNeckAvg": 0.1, "Centralized": 0.7}}
    for setting, strategies in bases.items():
        for strategy, base in strategies.items():
            d = tmp_path / setting / strategy
            d.mkdir(parents=True)
            for seed, clients in _client_csv(d, base).items():
                metrics, comm = d / f"seed{seed}_metrics.csv", d / f"seed{seed}_comm.csv"
                if strategy == "Centralized":  # per round-equivalent and client
                    pd.DataFrame([{"round": r, "client": c, "cval_map50": 0.2 * r + 0.1 * c}
                                  for r in (1, 2) for c in range(3)]).to_csv(metrics, index=False)
                    pd.DataFrame(columns=["round", "client", "bytes_sent"]).to_csv(comm, index=False)
                else:
                    pd.DataFrame({"round": [1, 2]}).to_csv(metrics, index=False)
                    pd.DataFrame([{"round": r, "client": c, "bytes_sent": 4.0, "selected_epoch": 0.0,
                                   "selected_val_map50": 0.1 * r + 0.01 * c + 0.1 * seed}
                                  for r in (1, 2) for c in range(3)]).to_csv(comm, index=False)
                runs.append({"setting": setting, "strategy": strategy, "seed": seed, "clients": str(clients),
                             "metrics": str(metrics), "comm": str(comm)})
    return runs


def _scores(runs):
    from fedmedbench.studies.ultraflwr.report import collect, id_cd, pair_matrix

    return id_cd(pair_matrix(collect(runs)))


def test_cd_is_the_mean_over_the_other_clients_test_splits(tmp_path):
    """Hand-made 3x3 matrices (model of client i x test split of client j): ID = the diagonal, CD = the
    mean over j != i (each split counts once, whatever its size), for the federated strategy and the
    centralized baseline alike (CD-C); the matrix table keeps every pair."""
    import pandas as pd

    from fedmedbench.fl.tasks.detection.task import cd_from_pairs
    from fedmedbench.studies.ultraflwr.report import collect, matrix_table, pair_matrix, top_strategies

    mats = {"FedAvg": [[0.9, 0.1, 0.3], [0.2, 0.8, 0.6], [0.5, 0.7, 0.4]],
            "Centralized": [[0.6, 0.0, 0.2], [0.4, 0.5, 0.0], [0.1, 0.3, 0.7]]}
    runs = []
    for strategy, m in mats.items():
        rows = [{"round": 1, "client": i, **{f"test{j}_map50": m[i][j] for j in range(3)},
                 **{f"test{j}_map50_95": m[i][j] / 2 for j in range(3)}} for i in range(3)]
        path = tmp_path / f"{strategy}.csv"
        pd.DataFrame(rows).to_csv(path, index=False)
        runs.append({"setting": "a", "strategy": strategy, "seed": 0, "clients": str(path)})
    matrix = pair_matrix(collect(runs))
    assert len(matrix) == 2 * 9
    scores = _scores(runs).set_index(["strategy", "client"])
    assert scores.loc["FedAvg", "local_map50"].tolist() == pytest.approx([0.9, 0.8, 0.4])
    assert scores.loc["FedAvg", "cd_map50"].tolist() == pytest.approx([0.2, 0.4, 0.6])
    assert scores.loc["FedAvg", "cd_map50_95"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert scores.loc["Centralized", "cd_map50"].tolist() == pytest.approx([0.1, 0.2, 0.2])
    # the engine's per-round columns agree with the report's reading of the matrix
    row1 = {f"test{j}_{k}": mats["FedAvg"][1][j] for j in range(3) for k in ("map50", "map50_95")}
    assert cd_from_pairs(row1, 1, 3)["cd_map50"] == pytest.approx(0.4)
    _, shown = top_strategies(_scores(runs), top_k=1)
    r = shown.iloc[0]
    assert (r["ID (%)"], r["CD (%)"]) == (pytest.approx(70.0), pytest.approx(40.0))
    assert (r["ID-C (%)"], r["CD-C (%)"]) == (pytest.approx(60.0), pytest.approx(16.7))
    mean, wide = matrix_table(matrix)
    fed = wide[wide["strategy"] == "FedAvg"].set_index("model of client")
    assert fed.loc[2, ["test 0 mAP50 (%)", "test 1 mAP50 (%)", "test 2 mAP50 (%)"]].tolist() == [50.0, 70.0, 40.0]
    assert mean["map50_count"].eq(1).all()


def test_top_strategies_ranks_by_id_and_reports_mean_std_over_clients_and_seeds(tmp_path):
    """Tables II/III from the matrix: top-3 per setting by federated ID mAP50 of the FINAL round, mean and
    std (ddof=1) over 3 clients x 2 seed sets, centralized ID-C/CD-C on the first row only; ties in name order."""
    from fedmedbench.studies.ultraflwr.report import top_strategies

    ranked, shown = top_strategies(_scores(_runs(tmp_path)), top_k=3)
    a = shown[shown["setting"] == "a"]
    assert a["Aggregation"].tolist() == ["FedMedian", "FedHeadAvg", "FedAvg"]  # FedNeckAvg (4th) left out
    assert a["Rank (ID)"].tolist() == [1, 2, 3]
    # values 0.6 + {0, .1, .2, .05, .15, .25}: mean 72.5 %, sample std 9.35 %
    assert a["ID (%)"].tolist() == [72.5, 67.5, 62.5] and a["ID (%) std"].tolist() == [9.4, 9.4, 9.4]
    assert a["CD (%)"].tolist() == [62.5, 57.5, 52.5]
    assert a["ID-C (%)"].iloc[0] == 57.5 and a["ID-C (%)"].iloc[1:].isna().all()
    assert a["CD-C (%)"].iloc[0] == 47.5 and a["CD-C (%) std"].iloc[0] == 9.4
    b = shown[shown["setting"] == "b"]
    assert b["Aggregation"].tolist() == ["FedAvg", "FedMedian", "FedHeadAvg"]  # FedAvg/FedMedian tie: name order
    assert b["ID-C (%)"].iloc[0] == 82.5  # centralized better than every federated strategy: still shown
    row = ranked[(ranked["setting"] == "a") & (ranked["strategy"] == "FedAvg")].iloc[0]
    assert row["local_map50_count"] == 6 and row["local_map50_mean"] == pytest.approx(0.625)
    assert row["local_map50_std"] == pytest.approx(np.std([0.5, 0.6, 0.7, 0.55, 0.65, 0.75], ddof=1))
    assert "Centralized" not in set(ranked["strategy"])


def test_tables_put_the_papers_values_beside(tmp_path):
    """The paper's Table II (typed in config/paper_values/ultraflwr.yaml) beside the run's: federated ID/CD by
    (setting, strategy), centralized once per setting; the difference is run minus paper on real data and
    empty on synthetic data."""
    from fedmedbench.studies.ultraflwr.report import top_strategies, with_paper

    _, shown = top_strategies(_scores(_runs(tmp_path)), top_k=3)
    real, note = with_paper(shown, "combined", synthetic=False)
    a = real[real["setting"] == "a"].set_index("Aggregation")
    assert a.loc["FedMedian", "ID (%) (paper)"] == 54.0 and a.loc["FedMedian", "CD (%) (paper)"] == 52.2
    assert a.loc["FedMedian", "ID (%) Δ"] == pytest.approx(72.5 - 54.0)
    assert np.isnan(a.loc["FedHeadAvg", "ID (%) (paper)"])  # not in the paper's top 3
    assert a["ID-C (%) (paper)"].tolist()[0] == 53.5 and np.isnan(a["ID-C (%) (paper)"].tolist()[1])
    assert "Table II" in note
    synth, _ = with_paper(shown, "combined", synthetic=True)
    assert synth["ID (%) (paper)"].notna().any() and synth["ID (%) Δ"].isna().all()
    t3, _ = with_paper(shown, "track20", synthetic=False)
    assert t3.set_index(["setting", "Aggregation"]).loc[("b", "FedAvg"), "ID (%) (paper)"] == 61.5


def test_collect_names_the_file_without_detection_metrics(tmp_path):
    import pandas as pd

    from fedmedbench.studies.ultraflwr.report import collect

    bad = tmp_path / "client_metrics.csv"
    pd.DataFrame({"round": [1], "client": [0], "accuracy": [0.5]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="client_metrics.csv: no per-client-pair detection metrics"):
        collect([{"setting": "a", "strategy": "FedAvg", "seed": 0, "clients": str(bad)}])


def test_figure3_curves_mean_std_per_round_over_clients_and_seeds(tmp_path):
    """Figure 3 data: per strategy and round, validation mAP50 over clients x seeds; every point is a local
    model right after local training (federated: the selected epoch's validation mAP50 from comm.csv;
    centralized: its per-client round-equivalent curve), and the figure is written."""
    from fedmedbench.studies.ultraflwr.report import curves, figure3

    runs = [r for r in _runs(tmp_path) if r["setting"] == "a" and r["strategy"] in ("FedAvg", "Centralized")]
    c = curves(runs).set_index(["strategy", "round"])
    fed_r2 = [0.2 + 0.01 * k + 0.1 * s for s in (0, 1) for k in range(3)]
    assert c.loc[("FedAvg", 2), "mean"] == pytest.approx(np.mean(fed_r2))
    assert c.loc[("FedAvg", 2), "std"] == pytest.approx(np.std(fed_r2, ddof=1))
    assert c.loc[("FedAvg", 1), "mean"] == pytest.approx(np.mean(fed_r2) - 0.1)
    cen_r1 = [0.2, 0.3, 0.4] * 2
    assert c.loc[("Centralized", 1), "mean"] == pytest.approx(0.3)
    assert c.loc[("Centralized", 1), "std"] == pytest.approx(np.std(cen_r1, ddof=1))
    assert c["count"].eq(6).all()
    target = tmp_path / "fig3.png"
    figure3(curves(runs), "combined", "synthetic", target)
    assert target.stat().st_size > 1000


def test_centralized_round_point_is_the_best_epoch_of_its_block():
    from fedmedbench.fl.tasks.detection.centralized import block_best

    curve = [0.1, 0.5, 0.3, float("nan"), 0.2, 0.4]
    assert [block_best(curve, r, 2) for r in (1, 2, 3)] == [0.5, 0.3, 0.4]
    assert np.isnan(block_best(curve, 4, 2))  # stopped early: no point


def test_study_config_validates_with_no_medmnist_study():
    """config/studies/ultraflwr.yaml (the paper's grid) has no MedMNIST study: the schema accepts an
    empty ``studies`` only when ultraflwr.groups has runs."""
    from pathlib import Path

    import yaml
    from snakemake.utils import validate

    from fedmedbench.studies.ultraflwr import runs as UFR

    root = Path(__file__).resolve().parents[1]
    schema = str(root / "config" / "schema.yaml")
    cfg = yaml.safe_load((root / "config" / "studies" / "ultraflwr.yaml").read_text())
    validate(cfg, schema)
    uf = cfg["ultraflwr"]
    assert cfg["studies"] == {} and cfg["surgical"]["origin"] == "real"
    assert uf["groups"] == {"combined": ["a", "b", "c"], "track20": ["a", "b", "c", "d"]}
    assert sorted(uf["strategies"]) == sorted(C.strategy_names()) and uf["seed_sets"] == [0, 1, 2]
    t = uf["train"]
    assert (t["rounds"], t["epochs"], t["batch"], t["select"], t["final_aggregation"]) == (20, 20, 8, "best", "skip_all")
    assert uf["model"]["head_init"] == "client"
    run = {"ugroup": "combined", "usetting": "a", "strategy": "Centralized", "seedset": 0}
    assert UFR.run_spec(uf, run, "s", None, "cpu", "real")["method_params"]["head_init"] == "client"
    # AP as Ultralytics 8.3 for training's epoch choice and for every reported mAP; 8.4's on request
    spec = UFR.run_spec(uf, run, "s", None, "cpu", "real")
    assert spec["method_params"]["ap"] == spec["task_params"]["ap"] == "ultralytics_8_3"
    spec = UFR.run_spec({**uf, "train": {**t, "ap": "installed"}}, run, "s", None, "cpu", "real")
    assert spec["method_params"]["ap"] == spec["task_params"]["ap"] == "installed"
    # matching and training samples as Ultralytics 8.3.48 (tests/test_ultralytics_8348.py); 8.4's on request
    spec = UFR.run_spec(uf, run, "s", None, "cpu", "real")
    assert spec["method_params"]["match"] == spec["task_params"]["match"] == spec["method_params"]["pipeline"]
    assert spec["method_params"]["pipeline"] == "ultralytics_8_3"
    spec = UFR.run_spec({**uf, "train": {**t, "match": "installed", "pipeline": "installed"}}, run, "s", None, "cpu", "real")
    assert spec["method_params"]["match"] == spec["task_params"]["match"] == spec["method_params"]["pipeline"] == "installed"
    # start weights: every run (UltraFlwr main, the default) or the centralized baseline only (its later branch)
    fed_run = {**run, "strategy": "FedAvg"}
    assert uf["model"]["start"] == "all" and UFR.run_spec(uf, fed_run, "s", "w.pt", "cpu", "real")["pretrained_path"] == "w.pt"
    later = {**uf, "model": {**uf["model"], "start": "centralized"}}
    assert UFR.run_spec(later, fed_run, "s", "w.pt", "cpu", "real")["pretrained_path"] is None
    assert UFR.run_spec(later, run, "s", "w.pt", "cpu", "real")["pretrained_path"] == "w.pt"
    empty = {**cfg, "ultraflwr": {**uf, "groups": {}}}
    with pytest.raises(Exception, match="studies|groups"):
        validate(yaml.safe_load(yaml.safe_dump(empty)), schema)


def test_validation_fuses_quietly_as_the_backend_would(export, tmp_path, monkeypatch):
    """validate_yolo hands Ultralytics an already fused copy: bit-identical to the model Ultralytics'
    own backend fuses for validation (so the same mAP), the caller's model untouched, and no FLOPs
    profile per validation."""
    import copy

    from ultralytics.nn.autobackend import AutoBackend
    from ultralytics.utils import torch_utils

    from fedmedbench.fl.tasks.detection.task import DetectionTask
    from fedmedbench.fl.tasks.detection.yolo import fused_copy, validate_yolo

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=3)
    train_yolo(model, data.data_yaml, epochs=1, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
               workdir=tmp_path / "t", select="last")  # BN statistics away from their initial values
    before = {k: v.clone() for k, v in model.state_dict().items()}
    def backend(m):  # what Ultralytics' validator builds around the model it is handed
        return AutoBackend(model=m, device=torch.device("cpu"), fuse=True, verbose=False).model

    theirs = backend(copy.deepcopy(model).float().eval())  # fused by the backend itself
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused_copy(model).modules())
    ours = backend(fused_copy(model))
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert all(torch.equal(v, theirs.state_dict()[k]) for k, v in ours.state_dict().items())
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(x)[0], theirs(x)[0])

    def no_flops(*a, **k):
        raise AssertionError("FLOPs profiled during validation")

    monkeypatch.setattr(torch_utils, "get_flops", no_flops)
    scores = validate_yolo(model, data.data_yaml, "val", imgsz=64, batch=8, device=torch.device("cpu"),
                           workdir=tmp_path / "w")
    assert set(scores) == {"map50", "map50_95"}
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("rect", [True, False])
def test_test_evaluation_uses_rectangular_batches_as_model_val(export, tmp_path, monkeypatch, rect):
    """Test-split scores are computed as Ultralytics' ``model.val()`` (UltraFlwr's test scripts) computes
    them: rectangular batches (a landscape frame at 192 px keeps its aspect ratio, padded per side to a
    multiple of 32, not to a square), the detection task's default; ``rect: false`` letterboxes to 192x192."""
    import ultralytics.models.yolo.detect as detect

    from fedmedbench.fl.tasks.detection.task import EVAL_DEFAULTS, DetectionTask
    from fedmedbench.fl.tasks.detection.yolo import validate_yolo

    seen = []

    class Recording(detect.DetectionValidator):
        def __call__(self, *a, **k):
            out = super().__call__(*a, **k)
            seen.append(self.dataloader.dataset)
            return out

    monkeypatch.setattr(detect, "DetectionValidator", Recording)
    assert EVAL_DEFAULTS["rect"] is True
    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=0)
    validate_yolo(model, data.data_yaml, "test", imgsz=192, batch=4, device=torch.device("cpu"),
                  workdir=tmp_path / "w", rect=rect)
    dataset = seen[-1]
    h, w = dataset.load_image(0)[0].shape[:2]  # the frame resized to a long side of 192
    assert dataset.rect is rect and w == 192 and h < 192
    fed_in = tuple(dataset[0]["img"].shape[1:])  # what the model is given
    if rect:  # the batch's shape: each side to a multiple of 32 with Ultralytics' 0.5-stride val padding
        assert fed_in == tuple(int(np.ceil(s / 32 + 0.5)) * 32 for s in (h, w)) and fed_in[0] < fed_in[1]
    else:
        assert fed_in == (192, 192)


def test_training_workers_are_a_result_parameter_that_reaches_ultralytics(export, tmp_path, monkeypatch):
    """``ultraflwr.train.workers`` (UltraFlwr: 0): in the run's hash once set (its augmentations differ), absent
    at 0 (earlier runs keep their hash), handed by the method and by train_yolo to Ultralytics' trainer."""
    from pathlib import Path
    from types import SimpleNamespace

    import yaml

    from fedmedbench.fl.api import ClientContext
    from fedmedbench.fl.tasks.detection import yolo as Y
    from fedmedbench.studies.ultraflwr import runs as UFR

    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "schema.yaml").read_text())
    assert schema["properties"]["ultraflwr"]["properties"]["train"]["properties"]["workers"]["default"] == 0
    train = {"rounds": 2, "epochs": 1, "batch": 8, "imgsz": 64, "lr0": 0.01, "patience": 100, "split": "ultraflwr",
             "select": "best", "select_metric": "fitness", "weighting": "uniform", "final_aggregation": "skip_all",
             "auto_optimizer": "ultralytics_8_3", "warmup": "ultralytics_8_3", "assigner": "ultralytics_8_3",
             "hsv": "ultralytics_8_3", "ap": "ultralytics_8_3", "match": "ultralytics_8_3", "pipeline": "ultralytics_8_3",
             "ultralytics": {}}
    conf = {"train": train, "model": {"cfg": "yolo11n.yaml", "head_init": "client"},
            "eval": {"every": 1, "batch": 16, "conf": 0.001, "iou": 0.7, "rect": True}}
    r = {"ugroup": "g", "usetting": "a", "strategy": "FedAvg", "seedset": 0}
    specs = {w: RunSpec.from_dict(UFR.run_spec({**conf, "train": {**train, "workers": w}}, r, "s", None, "cpu", "x"))
             for w in (0, 2)}
    assert "workers" not in specs[0].method_params and specs[2].method_params["workers"] == 2
    assert specs[0].run_hash() != specs[2].run_hash()
    with pytest.raises(ValueError, match=r"method_params\.ultraflwr\.workers: must be >= 0"):
        get_method("ultraflwr", {"workers": -1})

    asked = []
    monkeypatch.setattr(Y, "train_yolo", lambda *a, **kw: asked.append(kw["workers"]) or Y.TrainOutcome(
        state=build_yolo("yolo11n.yaml", 3, seed=0).state_dict(), selected_epoch=0, val_map50=[0.0]))
    method = get_method("ultraflwr", {"strategy": "FedAvg", "workers": 3})
    data = SimpleNamespace(data_yaml="unused.yaml", imgsz=64, seed=0, workdir="unused", num_train=5, read_ahead=False, pixel_thread=False)
    method.client_fit(ClientContext(pid=0, rnd=1, model=build_yolo("yolo11n.yaml", 3, seed=0), data=data,
                                    train=TrainConfig(rounds=2, local_epochs=1, batch_size=8, lr=0.01),
                                    device=torch.device("cpu"), generator=torch.Generator(), state={}, steps=0,
                                    global_arrays={}))
    assert asked == [3]
    monkeypatch.undo()

    seen = []
    made = Y.study_trainer

    def recording(*a, **k):
        class Recording(made(*a, **k)):
            def __init__(self, *args, overrides=None, **kwargs):
                seen.append(overrides["workers"])  # Ultralytics itself then loads in-process on a CPU
                super().__init__(*args, overrides=overrides, **kwargs)
        return Recording

    monkeypatch.setattr(Y, "study_trainer", recording)
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    train_yolo(build_yolo("yolo11n.yaml", spec.num_classes, seed=0), data.data_yaml, epochs=1, batch=8, imgsz=64,
               seed=0, device=torch.device("cpu"), workdir=tmp_path / "w", select="last", workers=1)
    assert seen == [1]


def test_evaluation_loader_workers_change_no_prediction(export, tmp_path, monkeypatch):
    """``engine.loader_workers``: the validator reads the images in order, so every image's predictions and
    the metrics are the same with worker processes as without; not in the run's hash."""
    import dataclasses
    import functools

    from ultralytics.models.yolo.detect import val as detect_val
    from ultralytics.utils import metrics as M

    from fedmedbench.fl.tasks.detection.task import DetectionTask
    from fedmedbench.fl.tasks.detection.yolo import validate_yolo

    spec = _spec(export, tmp_path, "FedAvg")
    assert dataclasses.replace(spec, loader_workers=2).run_hash() == spec.run_hash()
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=4)
    recorded: dict[int, list] = {}
    update = M.DetMetrics.update_stats
    build = detect_val.build_dataloader
    loaders = []

    def loader(dataset, batch, workers, *a, forced=0, **k):  # on a CPU Ultralytics sets workers to 0: a GPU's
        loaders.append(forced)  # loader is forced here so that worker processes really read the images
        return build(dataset, batch, forced, *a, **k)

    for workers in (0, 2):
        stats = recorded.setdefault(workers, [])
        monkeypatch.setattr(M.DetMetrics, "update_stats",
                            lambda self, stat, stats=stats: stats.append({k: np.array(v) for k, v in stat.items()})
                            or update(self, stat))
        monkeypatch.setattr(detect_val, "build_dataloader", functools.partial(loader, forced=workers))
        scores = validate_yolo(model, data.data_yaml, "test", imgsz=64, batch=4, device=torch.device("cpu"),
                               workdir=tmp_path / f"w{workers}", workers=workers)
        recorded[workers].append(scores)
    assert loaders == [0, 2]
    *images0, scores0 = recorded[0]
    *images2, scores2 = recorded[2]
    assert scores0 == scores2 and len(images0) == len(images2) > 2
    assert sum(len(s["conf"]) for s in images0) > 0  # the random model predicts boxes: a real comparison
    for a, b in zip(images0, images2, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a if k != "im_name")


def test_offline_ultralytics_touches_no_network_and_keeps_its_own_answers(tmp_path, monkeypatch):
    """Offline, the font check of every dataset check and the AMP check of a CUDA training (a download of
    yolo26n.pt) must not try the network (no timeout per local training or evaluation), and Ultralytics' offline
    answers stay: no font, AMP on."""
    from ultralytics.utils import checks, downloads

    from fedmedbench.fl.tasks.detection.yolo import ultralytics_offline

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setattr("ultralytics.utils.WEIGHTS_DIR", tmp_path)  # no cached yolo26n.pt
    monkeypatch.setattr(checks, "USER_CONFIG_DIR", tmp_path)  # no cached font
    reached = []

    def network(*args, **kwargs):
        reached.append(args)
        raise AssertionError("the network was tried")

    for name in ("requests.get", "requests.head"):
        monkeypatch.setattr(name, network)
    monkeypatch.setattr(downloads.subprocess, "run", network)
    model = torch.nn.Linear(2, 2, device="meta")  # a device that is neither the CPU nor MPS, as a GPU's
    saved = downloads.safe_download, downloads.is_url
    with ultralytics_offline():
        with pytest.raises(ConnectionError, match="offline"):
            downloads.attempt_download_asset(tmp_path / "yolo26n.pt")
        assert checks.check_amp(model) is True
        assert checks.check_font("NoSuchFont-fedmedbench.ttf") is None
        assert downloads.is_url("https://example.org/a.zip")  # the URL's form is still checked
    assert reached == [] and (downloads.safe_download, downloads.is_url) == saved
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_a_centralized_run_takes_every_training_option_of_the_method():
    """The centralized baseline trains with the same Ultralytics settings as the strategies: every method
    parameter run_centralized accepts reaches it (scripts/ultraflwr_train.py passes those in OPTIONS)."""
    import inspect

    from fedmedbench.fl.tasks.detection.centralized import OPTIONS, run_centralized

    accepted = set(inspect.signature(run_centralized).parameters) - {"spec", "log"}
    method = set(type(get_method("ultraflwr", {})).declared_params())
    assert set(OPTIONS) == accepted and accepted <= method
    assert {"warmup", "assigner", "hsv", "auto_optimizer", "workers"} <= set(OPTIONS)


def test_a_finished_run_leaves_its_results_not_its_stage(export, tmp_path):
    """The stage (a link per frame of every split and of the pooled set), Ultralytics' label caches and training
    folders are the run's working files: gone once the job's outputs are written, kept with keep_checkpoints."""
    import dataclasses
    import os

    from fedmedbench.fl.engine import flower as engine

    frames = sorted(p for p in export.parent.rglob("*") if p.is_file() and not p.is_symlink())
    for keep in (False, True):
        spec = dataclasses.replace(_spec(export, tmp_path / str(keep), "FedAvg", rounds=1), keep_checkpoints=keep)
        engine.run(spec, log=lambda m: None)
        run = Path(spec.run_dir)
        links = [p for p in (run / "work" / "stage").rglob("*") if p.is_symlink()]
        assert len(links) > 20 and (run / "checkpoint").is_dir()
        lines = []
        engine.complete(spec, log=lines.append)
        if keep:
            assert (run / "work" / "stage" / "STAGED.json").is_file() and (run / "checkpoint").is_dir()
            continue
        assert sorted(p.name for p in run.iterdir()) == ["client_metrics.csv", "metrics.csv", "model.pt", "summary.json"]
        left = sum(os.lstat(p).st_blocks * 512 for p in run.rglob("*"))
        assert left <= 2 * (run / "model.pt").stat().st_size
        assert any(f"removed its working files {run.resolve() / 'work'} (" in line for line in lines), lines
    assert sorted(p for p in export.parent.rglob("*") if p.is_file() and not p.is_symlink()) == frames  # frames kept


def test_batches_read_ahead_are_the_inline_batches(export, tmp_path, monkeypatch):
    """engine.loader_workers >= 1: a thread loads the local training's next batches while the model trains. The
    batches are the inline loader's, bit for bit, over epochs whose transforms change (close_mosaic), and so are
    the weights; the thread does run ahead (up to its depth), and is done by each epoch's end. The batches do show
    the streams' draws: one more draw in the training's thread, and the later batches are others."""
    import hashlib
    import random
    import threading

    from ultralytics.models.yolo.detect import DetectionTrainer

    from fedmedbench.fl.tasks.detection import read_ahead as RA
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    produced, seen, lead, extra_draw = [0], [], [], [False]
    put = RA._Reader._put

    def counted(self, entry):
        produced[0] += 1
        return put(self, entry)

    preprocess = DetectionTrainer.preprocess_batch

    def slow_step(self, batch):  # the model's step takes a while: the reader gets ahead of it
        lead.append(produced[0] - len(seen))
        seen.append(hashlib.sha1(batch["img"].numpy().tobytes()).hexdigest())
        if extra_draw[0] and len(seen) == 1:
            random.random()
        threading.Event().wait(0.05)
        return preprocess(self, batch)

    monkeypatch.setattr(RA._Reader, "_put", counted)
    monkeypatch.setattr(DetectionTrainer, "preprocess_batch", slow_step)
    runs = {}
    for mode in ("inline", "ahead", "inline", "drawn"):
        seen.clear()
        produced[0] = 0
        lead.clear()
        extra_draw[0] = mode == "drawn"
        out = train_yolo(build_yolo("yolo11n.yaml", spec.num_classes, seed=3), data.data_yaml, epochs=3, batch=4, imgsz=64,
                         seed=1, device=torch.device("cpu"), workdir=tmp_path / mode, extra={"close_mosaic": 1},
                         read_ahead=mode == "ahead")
        runs.setdefault(mode, []).append((list(seen), out))
        if mode == "ahead":
            assert produced[0] == len(seen) and max(lead) > 1  # every batch came from the reader, read ahead
        else:
            assert produced[0] == 0
    (inline, a), (inline_again, _), (ahead, c) = runs["inline"][0], runs["inline"][1], runs["ahead"][0]
    assert len(inline) > 6 and inline == inline_again == ahead
    assert all(torch.equal(a.state[k], c.state[k]) for k in a.state) and a.val_map50 == c.val_map50
    drawn = runs["drawn"][0][0]
    assert drawn[0] == inline[0] and drawn[1:] != inline[1:]
    assert not [t for t in threading.enumerate() if t.name == "yolo-read-ahead"]


def test_batches_are_read_ahead_only_where_the_draws_stay_in_order_and_an_abandoned_epoch_stops_reading():
    import threading

    from ultralytics.data.build import InfiniteDataLoader

    from fedmedbench.fl.tasks.detection import read_ahead as RA

    taken = []

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            taken.append(i)
            return i

    assert not RA.read_ahead(InfiniteDataLoader(Items(), batch_size=2, num_workers=1))  # a worker process's streams
    assert not RA.read_ahead(InfiniteDataLoader(Items(), batch_size=2), multi_scale=0.5)  # the step draws its size
    loader = InfiniteDataLoader(Items(), batch_size=2)
    assert RA.read_ahead(loader) and isinstance(loader, InfiniteDataLoader) and len(loader) == 6
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]  # one epoch, in order
    taken.clear()
    epoch = iter(loader)
    assert not taken  # nothing is read before a batch is taken
    assert next(epoch).tolist() == [0, 1]
    del epoch  # abandoned after one batch (the generator is closed): the reader stops, at most DEPTH + 1 ahead
    assert len(taken) <= 2 * (RA.DEPTH + 2) and not [t for t in threading.enumerate() if t.name == "yolo-read-ahead"]


def test_loader_workers_turn_on_reading_ahead_for_every_training_without_changing_the_run(export, tmp_path, monkeypatch):
    """engine.loader_workers >= 1 (not hashed: the same samples) reads the training batches ahead in the
    federated clients' and the centralized baseline's trainings; 0 (the default) loads each batch when used."""
    import dataclasses
    from types import SimpleNamespace

    from fedmedbench.fl.api import ClientContext
    from fedmedbench.fl.tasks.detection import yolo as Y
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    ahead = dataclasses.replace(spec, loader_workers=1)
    assert spec.run_hash() == ahead.run_hash()
    assert not DetectionTask(spec).client_data(0).read_ahead and not DetectionTask(spec).pooled_data().read_ahead
    assert DetectionTask(ahead).client_data(1).read_ahead and DetectionTask(ahead).pooled_data().read_ahead

    asked = []
    monkeypatch.setattr(Y, "train_yolo", lambda *a, **kw: asked.append(kw["read_ahead"]) or Y.TrainOutcome(
        state=build_yolo("yolo11n.yaml", 3, seed=0).state_dict(), selected_epoch=0, val_map50=[0.0]))
    for flag in (True, False):
        data = SimpleNamespace(data_yaml="unused.yaml", imgsz=64, seed=0, workdir="unused", num_train=5, read_ahead=flag, pixel_thread=False)
        get_method("ultraflwr", {"strategy": "FedAvg"}).client_fit(ClientContext(
            pid=0, rnd=1, model=build_yolo("yolo11n.yaml", 3, seed=0), data=data,
            train=TrainConfig(rounds=2, local_epochs=1, batch_size=8, lr=0.01), device=torch.device("cpu"),
            generator=torch.Generator(), state={}, steps=0, global_arrays={}))
    assert asked == [True, False]

    from fedmedbench.fl.tasks.detection import centralized as CEN

    class Asked(Exception):
        pass

    def centralized_training(*a, **kw):
        asked.append(("centralized", kw["read_ahead"]))
        raise Asked

    monkeypatch.setattr(CEN, "train_yolo", centralized_training)
    with pytest.raises(Asked):
        CEN.run_centralized(ahead, log=lambda m: None)
    assert asked[-1] == ("centralized", True)


def test_the_last_pixel_steps_in_a_second_thread_give_the_same_batches_and_weights(export, tmp_path, monkeypatch):
    """The HSV step's, the flips' and Format's pixel work runs in a second thread (their draws stay in the loader's):
    the batches are those of the steps run in place, bit for bit, over epochs whose transforms change
    (close_mosaic), inline and read ahead, and so are the weights; every sample's image went through the thread."""
    import hashlib

    from ultralytics.models.yolo.detect import DetectionTrainer

    from fedmedbench.fl.tasks.detection import pixel_thread as PT
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    seen, handed = [], [0]
    preprocess, submit = DetectionTrainer.preprocess_batch, PT._Pixels.submit

    def noted(self, batch):
        seen.append(hashlib.sha1(batch["img"].numpy().tobytes()).hexdigest())
        return preprocess(self, batch)

    def counted(self, img, steps):
        handed[0] += 1
        assert [kind for kind, _, _ in steps][-1] == "format" and "hsv" in [kind for kind, _, _ in steps]
        return submit(self, img, steps)

    monkeypatch.setattr(DetectionTrainer, "preprocess_batch", noted)
    monkeypatch.setattr(PT._Pixels, "submit", counted)
    runs = {}
    for mode in ("in place", "thread", "thread, read ahead"):
        seen.clear()
        handed[0] = 0
        out = train_yolo(build_yolo("yolo11n.yaml", spec.num_classes, seed=3), data.data_yaml, epochs=3, batch=4,
                         imgsz=64, seed=1, device=torch.device("cpu"), workdir=tmp_path / mode, extra={"close_mosaic": 1},
                         read_ahead="read ahead" in mode, pixel_thread=mode != "in place")
        runs[mode] = (list(seen), out, handed[0])
    (base, a, none), (thread, b, n_b), (ahead, c, n_c) = runs.values()
    assert len(base) > 6 and base == thread == ahead and none == 0
    assert n_b == n_c == 3 * data.num_train  # every training sample of the 3 epochs, the close_mosaic one too
    assert all(torch.equal(a.state[k], b.state[k]) and torch.equal(a.state[k], c.state[k]) for k in a.state)


def test_ap_extends_the_precision_envelope_to_recall_one_as_ultralytics_8_3():
    """One class, 3 ground-truth boxes, AP at 101 recall points (trapezoids of 0.01).
    [TP, FP, FP] (recall 1/3, precision 1, 1/2, 1/3): 8.4 ends the envelope at recall 1/3:
    0.33 + (1 + 0)/2 x 0.01 = 0.335; 8.3 runs it from 1/3 at recall 1/3 to 0 at recall 1, p(x) = (1 - x)/2:
    0.33 + (1 + 0.33)/2 x 0.01 + 0.66^2/4 = 0.44555. [TP]: 8.3 p(x) = 1.5 (1 - x) past 1/3:
    0.33 + (1 + 0.99)/2 x 0.01 + 1.5 x 0.66^2/2 = 0.66665; 8.4 0.335. Recall reaching 1 ([TP, TP] of 2):
    both 1 - 0.005 = 0.995."""
    from ultralytics.utils import metrics

    from fedmedbench.fl.tasks.detection.ap import ap_rule

    def ap(tp, n_labels, rule):
        tp = np.array(tp, bool)[:, None]
        conf = np.linspace(0.9, 0.5, len(tp))
        with ap_rule(rule):
            return float(metrics.ap_per_class(tp, conf, np.zeros(len(tp)), np.zeros(n_labels))[5][0, 0])

    installed = metrics.compute_ap
    assert ap([1, 0, 0], 3, "ultralytics_8_3") == pytest.approx(0.44555, abs=1e-12)
    assert ap([1, 0, 0], 3, "installed") == pytest.approx(0.335, abs=1e-12)
    assert ap([1], 3, "ultralytics_8_3") == pytest.approx(0.66665, abs=1e-12)
    assert ap([1], 3, "installed") == pytest.approx(0.335, abs=1e-12)
    assert ap([1, 1], 2, "ultralytics_8_3") == pytest.approx(0.995, abs=1e-12) == ap([1, 1], 2, "installed")
    assert metrics.compute_ap is installed  # restored after each block
    with pytest.raises(ValueError, match="ap must be one of"):
        with ap_rule("ultralytics_8_4"):
            pass


def test_every_validation_integrates_ap_and_matches_by_the_chosen_rules(export, tmp_path, monkeypatch):
    """validate_yolo (each reported mAP) and the trainer's own validations (the epoch a client sends)
    run Ultralytics' ap_per_class with 8.3's compute_ap, on true positives matched by 8.3.48's rule, by default;
    the installed ones on request."""
    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils import metrics

    from fedmedbench.fl.tasks.detection.ap import compute_ap_83
    from fedmedbench.fl.tasks.detection.task import DetectionTask
    from fedmedbench.fl.tasks.detection.yolo import validate_yolo

    installed, seen, inner = (metrics.compute_ap, BaseValidator.match_predictions), [], metrics.ap_per_class

    def spy(*args, **kwargs):
        seen.append((metrics.compute_ap, BaseValidator.match_predictions))
        return inner(*args, **kwargs)

    def is_83(rules) -> bool:
        return rules[0] is compute_ap_83 and rules[1].__module__.endswith("detection.matching")

    monkeypatch.setattr(metrics, "ap_per_class", spy)
    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    model = build_yolo("yolo11n.yaml", spec.num_classes, seed=3)
    train_yolo(model, data.data_yaml, epochs=1, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
               workdir=tmp_path / "t", select="best")
    assert seen and all(is_83(rules) for rules in seen)
    seen.clear()
    for rule in ("ultralytics_8_3", "installed"):
        validate_yolo(model, data.data_yaml, "test", imgsz=64, batch=8, device=torch.device("cpu"),
                      workdir=tmp_path / rule, ap=rule, match=rule)
        rules = seen.pop()
        assert not seen and (is_83(rules) if rule == "ultralytics_8_3" else rules == installed)
    assert (metrics.compute_ap, BaseValidator.match_predictions) == installed


def test_the_global_model_scores_each_clients_test_split_once(tmp_path, monkeypatch):
    """evaluate_global: the pooled test and validation sets and each client's test split validated once (N + 2
    validations, not N x N + 2); every client's row holds the same test<j> scores and its own ID/CD, as
    evaluate_client gives it."""
    from types import SimpleNamespace

    from fedmedbench.fl.tasks.detection.task import DetectionTask

    task = object.__new__(DetectionTask)
    task.spec = SimpleNamespace(image_size=64, seed=0, loader_workers=0, pixel_thread=True)
    task.manifest = {"clients": [{"counts": {"train": {"frames": n}}} for n in (5, 6, 7)],
                     "pooled": {"train": {"frames": 18}}}
    task.stage, task.work, task.params = tmp_path / "stage", tmp_path / "work", {}
    calls = []

    def val(model, data_yaml, split, device, workdir):
        calls.append((data_yaml, split))
        j = int(data_yaml.split("client_")[1].split("/")[0]) if "client_" in data_yaml else 9
        return {"map50": 0.1 * (j + 1), "map50_95": 0.05 * (j + 1)}

    monkeypatch.setattr(task, "_val", val)
    row, per_client = task.evaluate_global(None, "cpu")
    assert len(calls) == 3 + 2 and len(set(calls)) == 5
    assert row["global_map50"] == pytest.approx(1.0)
    for p in range(3):
        assert per_client[p] == task.evaluate_client(None, task.client_data(p), "cpu")
    assert per_client[1]["local_map50"] == pytest.approx(0.2)
    assert per_client[1]["cd_map50"] == pytest.approx((0.1 + 0.3) / 2)


def test_the_pixel_thread_trains_the_same_weights_and_is_the_engines_default(export, tmp_path, monkeypatch):
    """engine.pixel_thread (on by default, not hashed) reaches each client's training, and a training whose samples'
    last pixel steps run in one more thread ends with the same weights, bit for bit, as one loading thread; the
    training set really runs its pixel steps in that thread."""
    import dataclasses

    from fedmedbench.fl.tasks.detection import pixel_thread as PT
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    assert spec.pixel_thread and DetectionTask(spec).client_data(0).pixel_thread
    off = dataclasses.replace(spec, pixel_thread=False)
    assert not DetectionTask(off).client_data(0).pixel_thread and off.run_hash() == spec.run_hash()
    used = []
    monkeypatch.setattr(PT._Pixels, "submit", lambda self, img, steps, real=PT._Pixels.submit: used.append(1) or real(self, img, steps))
    data = DetectionTask(spec).client_data(0)
    states = {}
    for on in (False, True):
        model = build_yolo("yolo11n.yaml", spec.num_classes, seed=5)
        states[on] = train_yolo(model, data.data_yaml, epochs=2, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
                                workdir=tmp_path / f"px{on}", select="last", pixel_thread=on).state
        assert bool(used) == on
    assert all(torch.equal(states[True][k], states[False][k]) for k in states[False])


def test_a_local_training_loads_none_of_ultralytics_loggers(export, tmp_path, monkeypatch):
    """Ultralytics' settings turn MLflow's logger on (it wrote mlflow.db and mlruns/ into the working directory and
    called mlflow.autolog() in every local training): a training here builds its trainer with every third-party
    logger off, and the settings are as they were afterwards."""
    from ultralytics.utils import SETTINGS, callbacks

    from fedmedbench.fl.tasks.detection.task import DetectionTask
    from fedmedbench.fl.tasks.detection.yolo import INTEGRATIONS

    before = SETTINGS.get("mlflow")
    dict.__setitem__(SETTINGS, "mlflow", True)  # in memory: the settings file stays as it is
    seen = []
    real = callbacks.add_integration_callbacks
    monkeypatch.setattr(callbacks, "add_integration_callbacks",
                        lambda instance: seen.append({k: SETTINGS[k] for k in INTEGRATIONS}) or real(instance))
    try:
        spec = _spec(export, tmp_path, "FedAvg")
        data = DetectionTask(spec).client_data(0)
        model = build_yolo("yolo11n.yaml", spec.num_classes, seed=5)
        train_yolo(model, data.data_yaml, epochs=1, batch=8, imgsz=64, seed=0, device=torch.device("cpu"),
                   workdir=tmp_path / "w", select="last")
        assert seen and not any(any(flags.values()) for flags in seen)
        assert SETTINGS["mlflow"] is True
    finally:
        dict.__setitem__(SETTINGS, "mlflow", before)


def test_a_training_with_the_anchor_grid_kept_ends_with_the_same_weights(export, tmp_path, monkeypatch):
    """The loss's anchor grid made once (``anchors.anchors_kept``) instead of every step: the same weights,
    bit for bit, after a local training, with fewer grids made."""
    from contextlib import nullcontext

    from ultralytics.utils import loss

    from fedmedbench.fl.tasks.detection import yolo as Y
    from fedmedbench.fl.tasks.detection.task import DetectionTask

    spec = _spec(export, tmp_path, "FedAvg")
    data = DetectionTask(spec).client_data(0)
    made, make = [], loss.make_anchors
    monkeypatch.setattr(loss, "make_anchors", lambda *a, **k: made.append(1) or make(*a, **k))
    states, grids = {}, {}
    for kept in (True, False):
        if not kept:
            monkeypatch.setattr(Y, "anchors_kept", nullcontext)
        made.clear()
        model = build_yolo("yolo11n.yaml", spec.num_classes, seed=1)
        states[kept] = train_yolo(model, data.data_yaml, epochs=1, batch=8, imgsz=64, seed=0,
                                  device=torch.device("cpu"), workdir=tmp_path / str(kept), select="last").state
        grids[kept] = len(made)
    assert states[True].keys() == states[False].keys()
    assert all(torch.equal(states[True][k], states[False][k]) for k in states[True])
    assert grids[True] < grids[False]
