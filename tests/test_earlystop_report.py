"""Early-stopping report: stopping points, Tables 1-2 and Figs. 3-4 from hand-made metrics.csv files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from fedmedbench.report import figures
from fedmedbench.studies.earlystop import report as earlystop

METRIC = "global_balanced_accuracy"
VAL_LOSS = [1.0, 0.8, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99]  # best at r2; absolute tau 0.01, patience 2 -> stop r4
VAL_ACC = [0.2, 0.4, 0.5, 0.55, 0.5, 0.5, 0.5, 0.5]      # 55 % at r4, then no gain of > 0.01 points -> stop r6
TEST = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
NORMS = {  # reference growth rates, tau 0.01, patience 2
    "fires_r5": [1.0, 2.0, 2.5, 2.51, 2.515, 2.516, 2.517, 2.6],    # g4, g5 < 0.01 -> r* = 5 (printed 4)
    "fires_r6": [1.0, 2.0, 2.5, 2.6, 2.61, 2.611, 2.612, 2.7],      # g4 = 0.04, g5, g6 < 0.01 -> r* = 6
    "never": [float(r) for r in range(1, 9)],                        # g_r = 1/(r-1) > 0.01
}


def write_run(root, dataset, setting, method, seed, norms, test_offset=0.0):
    d = root / "results" / "earlystop" / dataset / setting / method / f"seed{seed}"
    d.mkdir(parents=True)
    pd.DataFrame({"round": np.arange(1, 9), "task_norm": norms, "val_loss": VAL_LOSS, "val_balanced_accuracy": VAL_ACC,
                  METRIC: [t + test_offset for t in TEST]}).to_csv(d / "metrics.csv", index=False)
    return d / "metrics.csv"


@pytest.fixture
def curves(tmp_path):
    paths = [write_run(tmp_path, "dermamnist", "dir", m, 0, NORMS["fires_r5"]) for m in ("fedavg", "fedprox")]
    paths += [write_run(tmp_path, "dermamnist", "dir", m, 1, NORMS["never"], 0.01) for m in ("fedavg", "fedprox")]
    paths += [write_run(tmp_path, "dermamnist", "bad", m, 0, NORMS["fires_r5"]) for m in ("fedavg", "fedprox")]
    paths += [write_run(tmp_path, "dermamnist", "bad", m, 1, NORMS["fires_r6"], 0.01) for m in ("fedavg", "fedprox")]
    return figures.load_curves(paths)


@pytest.fixture
def points(curves):
    return earlystop.stopping_points(curves, [0.01, 0.1], patience=2, metric=METRIC)


def one(points, setting, seed, tau=0.01, method="fedavg"):
    sel = (points["setting"] == setting) & (points["seed"] == seed) & np.isclose(points["tau"], tau)
    return points[sel & (points["method"] == method)].iloc[0]


def test_stopping_points_by_hand(points):
    row = one(points, "dir", 0)
    assert row["r_datafree"] == 5 and row["acc_datafree"] == pytest.approx(0.5)
    assert row["r_val_loss"] == 4 and row["acc_val_loss"] == pytest.approx(0.4)
    assert row["r_val_acc"] == 6 and row["acc_val_acc"] == pytest.approx(0.6)
    # ablation.py: delta acc against the better validation metric, delta r against the earlier validation stop
    assert row["delta_acc"] == pytest.approx(0.5 - 0.6) and row["delta_r"] == 5 - 4
    never = one(points, "dir", 1)
    assert not never["fired_datafree"] and math.isnan(never["r_datafree"]) and math.isnan(never["delta_acc"])


def test_never_fired_budget_option(curves):
    pts = earlystop.stopping_points(curves, [0.01], 2, METRIC, never_fired="budget")
    row = one(pts, "dir", 1)
    assert row["r_datafree"] == 8 and row["acc_datafree"] == pytest.approx(0.81)
    with pytest.raises(ValueError, match="never_fired"):
        earlystop.stopping_points(curves, [0.01], 2, METRIC, never_fired="maybe")


def test_table1_drops_seeds_where_a_rule_never_fired(points):
    t1 = earlystop.table1(points, 0.01, ["dir", "bad"], ["fedprox", "fedavg"])
    assert list(t1.columns) == ["dataset", "method", "dir", "bad"]
    assert list(t1["method"]) == ["fedprox", "fedavg"]
    # dir: seed 1 never fired and is left out -> seed 0 alone: (0.5 - 0.6) in points
    assert t1["dir"].tolist() == pytest.approx([-10.0, -10.0])
    # bad: seed 0 -10, seed 1 (0.61 - 0.61) = 0 -> -5
    assert t1["bad"].tolist() == pytest.approx([-5.0, -5.0])
    assert earlystop.dropped_note(points, 0.01) == ("Runs left out where a rule never fired: data-free 2 of 8; "
                                                   "both validation rules 0 of 8.")
    assert earlystop.dropped_note(points, 0.01, ["bad"]).startswith("Runs left out where a rule never fired: "
                                                                    "data-free 0 of 4;")
    only_dir = earlystop.table1(points, 0.01, ["dir"], ["fedavg", "fedprox"])
    assert list(only_dir.columns) == ["dataset", "method", "dir"]  # the bad configuration is not a Table 1 column


def test_table2_as_ablation_py_with_paper_column(points, tmp_path):
    t2 = earlystop.table2(points, "bad", 0.01, ["fedavg", "fedprox"])
    row = t2[t2["method"] == "fedavg"].iloc[0]
    assert row["acc"] == pytest.approx((0.5 + 0.61) / 2 * 100)
    assert row["r_star"] == pytest.approx((4 + 5) / 2)  # 0-based printed rounds of r* = 5 and 6
    assert row["delta_acc"] == pytest.approx((-10.0 + 0.0) / 2)
    assert row["delta_r"] == pytest.approx((1 + 2) / 2)
    assert row["n_fired"] == 2 and row["n_seeds"] == 2
    one_based = earlystop.table2(points, "bad", 0.01, ["fedavg"], numbering="one_based")
    assert one_based["r_star"].iloc[0] == pytest.approx(5.5)
    with pytest.raises(ValueError, match="no runs of setting 'nope'"):
        earlystop.table2(points, "nope", 0.1, ["fedavg"])
    (tmp_path / "earlystop.yaml").write_text(yaml.safe_dump({"paper": "P", "tables": {"table2": {
        "source": "Table 2", "keys": ["dataset", "method"],
        "rows": [{"dataset": "dermamnist", "method": "fedavg", "acc": 14.29, "r_star": 15.7, "delta_acc": 0.0,
                  "delta_r": 5.3}]}}}))
    cols = {c: c for c in ("acc", "r_star", "delta_acc", "delta_r")}
    real, note = earlystop.with_paper(t2, "earlystop", "table2", cols, synthetic=False, root=tmp_path)
    fedavg = real[real["method"] == "fedavg"].iloc[0]
    assert fedavg["r_star (paper)"] == 15.7 and fedavg["r_star Δ"] == pytest.approx(4.5 - 15.7)
    assert math.isnan(real[real["method"] == "fedprox"].iloc[0]["acc (paper)"])
    synth, snote = earlystop.with_paper(t2, "earlystop", "table2", cols, synthetic=True, root=tmp_path)
    assert synth["acc (paper)"].iloc[0] == 14.29 and synth["acc Δ"].isna().all() and "left empty" in snote
    md, tex = tmp_path / "t.md", tmp_path / "t.tex"
    earlystop.write_markdown_latex(real, "cap", md, tex, "tab:x")
    text = md.read_text()
    assert "| fedavg" in text and "55.50" in text and "4.5" in text and "-5.00" in text and "+1.5" in text


def test_figure3_content(curves, points):
    data = earlystop.figure3_data(curves, points, "fedavg", "dir", 0.01, 2, METRIC)["dermamnist"]
    assert data["acc"]["mean"].tolist() == pytest.approx([100 * t + 0.5 for t in TEST])
    assert data["acc"]["std"].tolist() == pytest.approx([0.5] * 8)  # population std of {x, x + 1}
    # stopping points: data-free from the seed where it fired only; both validation rules separately
    assert data["stops"] == {"datafree": 5.0, "val_loss": 4.0, "val_acc": 6.0}
    g = data["growth"]["mean"]
    assert g.iloc[:2].isna().all()  # rounds 1-2 not drawn (result1.py)
    assert g.iloc[2] == pytest.approx((0.25 + 0.5) / 2)
    fig = earlystop.figure3(curves, points, "fedavg", "dir", 0.01, 2, METRIC, "synthetic")
    top, bottom = fig.axes[0], fig.axes[1]
    xs = sorted(float(line.get_xdata()[0]) for line in top.lines[1:])
    assert xs == [4.0, 5.0, 6.0]
    assert any("data-free stop (mean r=5.0, fired in 1/2 seeds)" in t.get_text() for t in top.get_legend().get_texts())
    lo, hi = bottom.get_ylim()
    growth_line = next(line for line in bottom.lines if line.get_label() == "growth rate g_r")
    y = np.asarray(growth_line.get_ydata(), dtype=float)
    assert np.all((y[np.isfinite(y)] >= lo) & (y[np.isfinite(y)] <= hi)) and lo <= 0.01 <= hi
    assert "SYNTHETIC" in fig._suptitle.get_text()


def test_figure4_content(points):
    data = earlystop.figure4_data(points, "dir", [0.01, 0.1])
    row = data[(data["method"] == "fedavg") & np.isclose(data["tau"], 0.01)].iloc[0]
    assert row["acc_datafree_mean"] == pytest.approx(50.0) and math.isnan(row["acc_datafree_std"])
    assert row["acc_val_best_mean"] == pytest.approx(60.5)
    assert row["acc_val_best_std"] == pytest.approx(np.std([60.0, 61.0], ddof=1))  # sample std, as result3.py
    fig = earlystop.figure4(points, "dir", [0.005, 0.01, 0.1], ["fedavg", "fedprox"], METRIC, "synthetic")
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0.005", "0.01", "0.1"]
    assert "never fired, left out: 4 of 8" in fig._suptitle.get_text()  # seed 1 x 2 methods x 2 taus


def test_missing_columns_named(curves):
    with pytest.raises(KeyError, match="task_norm"):
        earlystop.stopping_points(curves.drop(columns="task_norm"), [0.01], 2, METRIC)


def test_paper_values_typed_in():
    from fedmedbench.report import paper_values

    t1 = paper_values.load("earlystop", "table1")
    assert t1.lookup({"dataset": "dermamnist", "method": "fedwmsam"}, "path2") == 29.10
    assert t1.lookup({"dataset": "bloodmnist", "method": "fedwmsam"}, "qty1.0") == -12.50
    assert len(t1.rows) == 20 and all(len(r) == 2 + 9 for r in t1.rows)
    t2 = paper_values.load("earlystop", "table2")
    assert t2.lookup({"dataset": "dermamnist", "method": "scaffold"}, "r_star") == 26.0
    assert t2.lookup({"dataset": "bloodmnist", "method": "fedwmsam"}, "delta_r") == 9.7
    assert t2.lookup({"dataset": "bloodmnist", "method": "fedavg"}, "acc") == 12.50
