"""UltraFlwr: component key maps, Table I from the model, what partial aggregation does and does
not aggregate, persistent client components across rounds and resume, the YOLO wrapper's
weight capture, and one small federated run through the detection task."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import surgical as F

from fedmedbench.fl import federation as fed
from fedmedbench.fl.detection import components as C
from fedmedbench.fl.detection.yolo import build_yolo, train_yolo
from fedmedbench.fl.registry import ClientResult, ServerContext, TrainConfig, get_method
from fedmedbench.fl.spec import RunSpec


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
    from fedmedbench.report.ultraflwr import PAPER_TABLE1, table1

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
        arrays = {k: (state[k] + rng.normal(size=state[k].shape).astype(state[k].dtype)) for k in keys}
        out.append(ClientResult(arrays=arrays, num_examples=[1, 2, 7][i]))
    return keys, out


@pytest.mark.parametrize("strategy", ["FedBackboneNeckAvg", "FedHeadMedian"])
def test_aggregation_only_touches_selected_components(strategy):
    method = get_method("ultraflwr", {"strategy": strategy})
    model = build_yolo("yolo11n.yaml", 3, seed=0)
    keys, results = _results(method, model)
    old = {k: v.numpy() for k, v in model.state_dict().items() if k in keys}
    ctx = ServerContext(rnd=1, global_arrays=old, results=results, pids=[0, 1, 2], state={}, num_clients=3,
                        device=torch.device("cpu"), train=TrainConfig(rounds=3, local_epochs=1, batch_size=8, lr=0.01),
                        new_model=lambda: model)
    new = method.aggregate(ctx)
    assert set(new) == set(keys)
    k = keys[0]
    stack = np.stack([r.arrays[k] for r in results])
    expected = np.median(stack, 0) if "Median" in strategy else np.tensordot(np.array([1, 2, 7]) / 10, stack, 1)
    np.testing.assert_allclose(new[k], expected, rtol=1e-5, atol=1e-6)
    components, _ = C.parse_strategy(strategy)
    other = [c for c in C.COMPONENTS if c not in components]
    assert not set(new) & {k for c in other for k in C.component_keys(model, "ultraflwr")[c]}
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


def _spec(export, tmp_path, strategy, rounds=2, **mp):
    spec = RunSpec(run_dir=str(tmp_path / strategy), study="ultraflwr", dataset="g", setting="a", method="ultraflwr",
                   seed=0, partition_path=str(export), sources={}, image_size=64, model="yolo11n.yaml",
                   train={"rounds": rounds, "local_epochs": 1, "batch_size": 8, "lr": 0.01},
                   method_params={"strategy": strategy, **mp}, task="detection", device="cpu")
    return fed.resolve_data_shapes(spec)


def test_trainer_uses_our_weights_and_returns_fp32_validated_ema(export, tmp_path):
    """The model handed in is trained (not rebuilt), weights come back in fp32 from the selected epoch."""
    from fedmedbench.fl.detection.task import DetectionTask

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
    assert changed
    assert not list((tmp_path / "w").rglob("*.pt"))  # no fp16 checkpoints written
    assert not list(export.parent.rglob("*.cache"))  # label caches stay in the run's stage


def test_partial_run_keeps_local_components_bit_identical(export, tmp_path):
    """FedBackboneNeckAvg: after aggregation the head of each client is exactly its own; the
    aggregated components equal the weighted mean; the last round uploads nothing (omitted)."""
    spec = _spec(export, tmp_path, "FedBackboneNeckAvg", rounds=2)
    f = fed.Federation(spec, log=lambda m: None)
    kept: dict[int, dict] = {}

    class Recording(fed.InProcessTransport):
        def train(self, rnd, steps, arrays, broadcast):
            out = super().train(rnd, steps, arrays, broadcast)
            kept[rnd] = {p: f.store.load(p, before_round=rnd + 1)["model"] for p in steps}  # what each client kept
            return out

    state = f.run(Recording(spec))
    method = get_method("ultraflwr", spec.method_params)
    model = fed.new_model(spec)
    head = C.component_keys(model, "ultraflwr")["head"]
    shared = method.shared_keys(model)
    assert not set(head) & set(shared)
    r1 = kept[1]
    for p in range(3):
        ctx, _ = fed._client_context(spec, p, 3, state.arrays, steps=0)  # as client_evaluate after round 2
        personal = method.personal_model(ctx).state_dict()
        # final aggregation omitted: the client's own round-2 model, everything included
        r2 = kept[2][p]
        assert all(torch.equal(personal[k], r2[k]) for k in r2)
    # round-1 aggregation: shared keys = weighted mean of what clients trained, head not touched
    sizes = np.array(f.task.client_sizes(), dtype=float)
    k = shared[0]
    expected = sum(w * r1[p][k].numpy().astype(np.float64) for p, w in enumerate(sizes / sizes.sum()))
    rows = state.server_state["ultraflwr_clients"]
    assert [r["bytes_sent"] > 0 for r in rows] == [True] * 3 + [False] * 3
    assert rows[0]["elements_sent"] == sum(r1[0][k].numel() for k in shared)
    assert np.allclose(state.arrays[k], expected, atol=1e-6)
    # the client's head after round 1 == its own trained head (not averaged with the others)
    restored, _ = fed._client_context(spec, 1, 2, state.arrays, steps=0)
    restored.state = {"model": r1[1]}
    method._restore_own(restored, everything=False)
    sd = restored.model.state_dict()
    assert all(torch.equal(sd[h], r1[1][h]) for h in head)
    assert all(np.array_equal(sd[s].numpy(), state.arrays[s]) for s in shared)
    assert not torch.equal(r1[0][head[-2]], r1[1][head[-2]])  # clients' heads really differ
    client_rows = json.loads(json.dumps(state.client_rows))
    assert {"local_map50", "cd_map50", "cval_map50"} <= set(client_rows[0])
