"""Early-stopping report: stopping points, Table 1/2 and figures from fabricated logs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedmedbench.report import earlystop


def fake_run(dataset, setting, method, seed, norms, val_loss, val_acc, test):
    n = len(norms)
    return pd.DataFrame({"round": np.arange(1, n + 1), "task_norm": norms, "val_loss": val_loss,
                         "val_balanced_accuracy": val_acc, "global_balanced_accuracy": test,
                         "dataset": dataset, "setting": setting, "method": method, "seed": seed})


@pytest.fixture
def curves():
    norms = [1.0, 2.0, 2.5, 2.51, 2.515, 2.516, 2.517, 2.6]      # g < 0.01 from round 4 on
    val_loss = [1.0, 0.8, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99]     # best at r2, patience 2 -> stop r4
    val_acc = [0.2, 0.4, 0.5, 0.55, 0.5, 0.5, 0.5, 0.5]          # best at r4 -> stop r6
    test = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    runs = [fake_run("dermamnist", s, m, seed, norms, val_loss, val_acc, [t + 0.01 * seed for t in test])
            for s in ("dir", "bad") for m in ("fedavg", "fedprox") for seed in (0, 1)]
    return pd.concat(runs, ignore_index=True)


def test_stopping_points_by_hand(curves):
    pts = earlystop.stopping_points(curves, [0.01], patience=2, metric="global_balanced_accuracy", min_delta="absolute")
    row = pts[(pts["setting"] == "dir") & (pts["method"] == "fedavg") & (pts["seed"] == 0)].iloc[0]
    assert row["r_datafree"] == 5  # kappa_4 = 1, kappa_5 = 2
    assert row["r_val_loss"] == 4 and row["r_val_acc"] == 6
    assert row["best_val_rule"] == "val_acc" and row["acc_val_best"] == pytest.approx(0.6)
    assert row["delta_acc"] == pytest.approx(0.5 - 0.6) and row["delta_r"] == 5 - 6
    assert row["rounds_saved"] == 8 - 5


def test_tables_and_figures(curves, tmp_path):
    pts = earlystop.stopping_points(curves, [0.01, 0.1], patience=2, metric="global_balanced_accuracy",
                                    min_delta="absolute")
    t1 = earlystop.table1(pts, 0.01, ["dir", "bad"], ["fedprox", "fedavg"])
    assert list(t1.columns) == ["dataset", "method", "dir", "bad"]
    assert list(t1["method"]) == ["fedprox", "fedavg"]
    assert t1["dir"].tolist() == pytest.approx([-10.0, -10.0])  # (0.5 - 0.6) in points, same for both seeds
    t2 = earlystop.table2(pts, "bad", 0.1, ["fedavg", "fedprox"])
    assert {"acc", "r_star", "delta_acc", "delta_r", "rounds_saved"} <= set(t2.columns)
    with pytest.raises(ValueError, match="no runs of setting 'nope'"):
        earlystop.table2(pts, "nope", 0.1, ["fedavg"])
    earlystop.write_markdown_latex(t1, "cap", tmp_path / "t.md", tmp_path / "t.tex", "tab:x")
    assert "-10.00" in (tmp_path / "t.md").read_text()
    f3 = earlystop.figure3(curves, pts, "fedavg", "dir", 0.01, "global_balanced_accuracy", "synthetic")
    f4 = earlystop.figure4(pts, "dir", ["fedavg", "fedprox"], "global_balanced_accuracy", "synthetic")
    assert "SYNTHETIC" in f3._suptitle.get_text() and len(f4.axes) == 2


def test_missing_columns_named(curves):
    with pytest.raises(KeyError, match="task_norm"):
        earlystop.stopping_points(curves.drop(columns="task_norm"), [0.01], 2, "global_balanced_accuracy")
