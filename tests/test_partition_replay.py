"""The early-stopping authors' random draws replayed: partitions and per-round clients, sample for sample.

``fixtures/earlystop_reference_draws.json`` holds what the reference code itself drew: github
yjlee22/earlystop at commit 52e7d7f8e6f298a83a568f566b11b5e13dead4bd, run outside this project by
``fixtures/record_earlystop_draws.py`` on a hand-made vector of 43 labels (3 classes), 10 clients:

* ``clients``: ``np.random.seed(seed)`` (train.py:54), then ``dataset.DatasetObject(n_client=10, seed,
  rule, rule_arg, data_path=<empty folder>)`` (dataset.py:72-188, no cache yet); per client the
  train-split positions of its samples, in the order of its ``client_x`` array;
* ``sampled_cache_build``: then five calls ``server.Server._activate_clients_(t)`` (server/server.py:83-88)
  with ``total_client=10, active_ratio=0.3``: the run that builds the partition cache;
* ``sampled_cache_read``: ``np.random.seed(seed)``, the same ``DatasetObject`` again (it finds the
  cache and draws nothing), five ``_activate_clients_``: every later run of that setting and seed;
* ``paper_sequence``: ``np.random.seed(seed)``, five ``_activate_clients_`` with the paper's 100 clients,
  ``active_ratio=0.1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedmedbench.partition import replay as R
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "earlystop_reference_draws.json").read_text())
SCHEME = {"Dirichlet": "fls", "Pathological": "fls_pathological", "Quantity": "fls_quantity", "iid": "iid"}
LABELS = np.array(RECORDED["labels"])
N, M, K = RECORDED["num_clients"], RECORDED["clients_per_round"], RECORDED["num_classes"]


def _params(case: dict) -> dict:
    scheme = SCHEME[case["rule"]]
    if scheme == "iid":
        return {}
    if scheme == "fls_pathological":
        return {"classes_per_client": int(case["arg"])}
    return {"alpha": case["arg"]}


def _split(train: np.ndarray) -> dict[str, np.ndarray]:
    return {"train": train, "val": np.array([0, 1, 2, 0, 1, 2]), "test": np.array([2, 1, 0, 0, 1, 2, 1])}


def _case_id(case: dict) -> str:
    return f"{case['rule']}-{case['arg']}-seed{case['seed']}"


@pytest.mark.parametrize("case", RECORDED["cases"], ids=_case_id)
def test_partition_replays_the_reference_sample_for_sample(case):
    doc = P.build_partition(_split(LABELS), SCHEME[case["rule"]], N, case["seed"], _params(case), num_classes=K,
                            draws="reference")
    assert [c["train"] for c in doc["clients"]] == case["clients"]
    assert doc["random_draws"] == "reference"


@pytest.mark.parametrize("case", RECORDED["cases"], ids=_case_id)
def test_client_sequences_replay_the_reference_server(case):
    doc = P.build_partition(_split(LABELS), SCHEME[case["rule"]], N, case["seed"], _params(case), num_classes=K,
                            draws="reference")
    fresh = R.client_sequence("reference", case["seed"], N, M)
    after = R.client_sequence("reference_cache_build", case["seed"], N, M, doc)
    assert [fresh.clients(r) for r in range(1, 6)] == case["sampled_cache_read"]
    assert [after.clients(r) for r in range(1, 6)] == case["sampled_cache_build"]


@pytest.mark.parametrize("seed", sorted(RECORDED["paper_sequence"]))
def test_paper_sized_client_sequence(seed):
    seq = R.client_sequence("reference", int(seed), 100, 10)
    assert [seq.clients(r) for r in range(1, 6)] == RECORDED["paper_sequence"][seed]


def test_a_late_first_round_gives_the_same_clients():
    """A resumed run asks for round 4 first: the sets are those of a run from round 1."""
    late, full = R.client_sequence("reference", 0, 100, 10), R.client_sequence("reference", 0, 100, 10)
    assert late.clients(4) == [full.clients(r) for r in range(1, 5)][3]


def test_federation_samples_the_reference_clients(tmp_path):
    from fedmedbench.data import synthetic
    from fedmedbench.fl.engine import federation as fed
    from fedmedbench.fl.spec import RunSpec

    case = next(c for c in RECORDED["cases"] if c["rule"] == "Dirichlet")
    arrays = synthetic.generate("dermamnist", 28, seed=0, counts={"train": len(LABELS), "val": 6, "test": 7})
    labels = _split(LABELS)
    for s in ("train", "val", "test"):  # the recorded labels: 3 classes
        arrays[f"{s}_labels"] = labels[s].reshape(-1, 1).astype(arrays[f"{s}_labels"].dtype)
    io.write_npz(tmp_path / "d.npz", arrays)
    io.write_json(tmp_path / "p.json", P.build_partition(labels, "fls", N, case["seed"], _params(case), num_classes=K,
                                                         draws="reference"))

    def federation(draws: str) -> fed.Federation:
        spec = RunSpec(run_dir=str(tmp_path / draws), study="t", dataset="dermamnist", setting="s", method="fedavg",
                       seed=case["seed"], partition_path=str(tmp_path / "p.json"), sources={"base": str(tmp_path / "d.npz")},
                       image_size=28, train={"rounds": 5, "local_epochs": 1, "batch_size": 4, "lr": 0.01},
                       device="cpu", clients_per_round=M, random_draws=draws)
        return fed.Federation(spec, log=lambda m: None)

    assert [federation("reference").sample(r) for r in range(1, 6)] == [sorted(s) for s in case["sampled_cache_read"]]
    assert ([federation("reference_cache_build").sample(r) for r in range(1, 6)]
            == [sorted(s) for s in case["sampled_cache_build"]])
    # today's sampler: the sets it drew before the reference draws existed
    assert [federation("project").sample(r) for r in range(1, 6)] == [[5, 7, 8], [3, 4, 7], [0, 5, 7], [4, 5, 8], [3, 4, 8]]


#: today's fls partitions of the 43 labels (seed 0), as drawn before the reference draws existed
PROJECT_DRAWS = {
    "fls": ({"alpha": 0.1}, [[4, 29, 23, 39, 18, 20, 36], [19, 36, 14, 35], [42, 0, 33, 1], [32, 9, 3, 19],
                             [17, 13, 7, 10], [8, 15, 31, 26], [24, 6, 38, 41], [37, 16, 2, 25], [30, 28, 4, 29],
                             [5, 40, 34, 21]]),
    "fls_quantity": ({"alpha": 0.5}, [[5], [29], [7, 14, 16, 20, 22, 33, 37], [8, 32, 35], [4, 27, 38],
                                      [9, 19, 23, 30, 40, 41], [2, 10, 11, 12, 13, 15, 17, 18, 25, 26, 28, 31, 34, 36],
                                      [1, 3, 24, 39, 42], [0, 21], [6]]),
}


@pytest.mark.parametrize("scheme", sorted(PROJECT_DRAWS))
def test_project_draws_are_unchanged(scheme):
    params, expected = PROJECT_DRAWS[scheme]
    for draws in ({}, {"draws": "project"}):
        doc = P.build_partition(_split(LABELS), scheme, N, 0, params, num_classes=K, **draws)
        assert [c["train"] for c in doc["clients"]] == expected
        assert "random_draws" not in doc and "rng_after_partition" not in doc


@pytest.mark.parametrize("scheme,params,draws,match", [
    ("dirichlet", {"alpha": 0.5}, "reference", "no reference draws"),
    ("fls_quantity", {"alpha": 0.5, "min_size": 2}, "reference", "1 sample first"),
    ("fls", {"alpha": 0.5}, "authors", "random_draws"),
])
def test_bad_requests_fail_clearly(scheme, params, draws, match):
    with pytest.raises(P.PartitionError, match=match):
        P.build_partition(_split(LABELS), scheme, N, 0, params, num_classes=K, draws=draws)


def test_cache_build_reading_needs_a_replayed_partition():
    with pytest.raises(ValueError, match="rng_after_partition"):
        R.client_sequence("reference_cache_build", 0, N, M, {"clients": []})


def test_schema_and_study_grid_name_the_readings():
    root = Path(__file__).parents[1]
    schema = yaml.safe_load((root / "config" / "schema.yaml").read_text())
    prop = schema["definitions"]["study"]["properties"]["random_draws"]
    assert tuple(prop["enum"]) == R.DRAWS and prop["default"] == "project"
    grid = yaml.safe_load((root / "config" / "studies" / "earlystop.yaml").read_text())
    study = grid["studies"]["earlystop"]
    assert study["random_draws"] == "reference"
    assert all(s["scheme"] in R.REPLAYED_SCHEMES for s in study["settings"].values())


#: the reference's start model (yjlee22/earlystop train.py:53, 69-72: timm convnextv2_nano, 3 channels, DermaMNIST's
#: 7 classes) after torch.manual_seed(seed): as the runs that read the partition cache build it, and as the run that
#: built it, after dataset.py:64-66's three DataLoader iterators (timm 1.0.31, torch 2.13, CPU)
START_MODELS = json.loads((Path(__file__).parent / "fixtures" / "earlystop_initial_model.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_cache_building_run_starts_from_the_references_model(tmp_path, seed):
    from fedmedbench.data import synthetic
    from fedmedbench.fl.engine import federation as fed
    from fedmedbench.fl.spec import RunSpec

    labels = {s: np.arange(n) % 7 for s, n in (("train", 70), ("val", 7), ("test", 7))}
    arrays = synthetic.generate("dermamnist", 64, seed=0, counts={s: len(v) for s, v in labels.items()})
    for s, v in labels.items():
        arrays[f"{s}_labels"] = v.reshape(-1, 1).astype(arrays[f"{s}_labels"].dtype)
    io.write_npz(tmp_path / "d.npz", arrays)
    io.write_json(tmp_path / "p.json", P.build_partition(labels, "iid", 10, seed, {}, num_classes=7, draws="reference"))

    def head(draws: str) -> torch.Tensor:
        spec = RunSpec(run_dir=str(tmp_path / draws), study="t", dataset="dermamnist", setting="s", method="fedavg",
                       seed=seed, partition_path=str(tmp_path / "p.json"), sources={"base": str(tmp_path / "d.npz")},
                       image_size=64, model="timm:convnextv2_nano", device="cpu", clients_per_round=2, random_draws=draws,
                       train={"rounds": 1, "local_epochs": 1, "batch_size": 4, "lr": 0.01})
        return fed.Federation(fed.resolve_data_shapes(spec), log=lambda m: None).initial_state().arrays["head.fc.weight"]

    for draws, run in (("reference", "cache_read"), ("reference_cache_build", "cache_build")):
        want = START_MODELS[f"DermaMNIST_seed{seed}_{run}"]
        got = head(draws)
        assert list(got.shape) == want["head_fc_weight_shape"]
        np.testing.assert_allclose(got[0, :5].numpy(), want["head_fc_weight_0_first5"], atol=5e-9)
        assert float(got.double().sum()) == pytest.approx(want["head_fc_weight_sum"], abs=1e-6)
