"""FedST tables from hand-made run rows: cells, rows, columns and the paper's numbers beside them."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from fedmedbench.studies.fedst import report as R


def _runs() -> pd.DataFrame:
    rows = []
    for seed, (d0, d1) in enumerate(((0.80, 0.60), (0.90, 0.70))):
        row = {"variant": "main", "method": "fedst", "seed": seed, "c0_dice": d0, "c1_dice": d1, "outfed_dice": 0.5,
               "comm_mb_per_round": 12.5, "train_time_s": 100.0 + seed, "server_time_s": 40.0, "local_time_s": 60.0 + seed,
               "fps": 20.0}
        for m in ("iou", "hd95", "assd"):
            row.update({f"c0_{m}": 0.5, f"c1_{m}": 0.5, f"outfed_{m}": 0.5})
        rows.append(row)
    rows.append({**rows[0], "method": "seg_fedavg", "seed": 0, "c0_dice": 0.7, "c1_dice": 0.7, "server_time_s": 0.0})
    return pd.DataFrame(rows)


def test_table2_cells_are_mean_and_std_over_seeds():
    t = R.table2(_runs(), ["A", "B"], ["seg_fedavg", "fedst"])
    assert list(t["Method"]) == ["FedAvg", "FedST"]
    fedst = t.set_index("Method").loc["FedST"]
    assert fedst["Dice(%)↑ A"] == "85.00 ± 5.00"  # (80, 90): population std over seeds
    assert fedst["Dice(%)↑ Avg."] == "75.00 ± 5.00"  # per-seed averages 70 and 80
    assert t.set_index("Method").loc["FedAvg", "Dice(%)↑ A"] == "70.00"  # one seed: no std


def test_table9_splits_local_and_server_time():
    t = R.table9(_runs(), ["fedst", "seg_fedavg"]).set_index("Method")
    assert t.loc["FedST", "Cost (MB/round)"] == "12.50"
    assert t.loc["FedST", "Server time (s)"] == "40.00 ± 0.00" and t.loc["FedST", "Local time (s)"] == "60.50 ± 0.50"
    assert t.loc["FedAvg", "Server time (s)"] == "0.00"


def test_paper_columns_beside_the_run(tmp_path):
    doc = {"paper": "Fang et al.", "tables": {"table2": {"source": "Table II", "keys": ["Method"],
                                                          "rows": [{"Method": "FedST", "Dice(%)↑ A": 84.73}]}}}
    (tmp_path / "fedst.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    t = R.table2(_runs(), ["A", "B"], ["seg_fedavg", "fedst"])
    real, note = R.with_paper(t, "table2", synthetic=False, root=tmp_path)
    cols = list(real.columns)
    i = cols.index("Dice(%)↑ A")
    assert cols[i + 1: i + 3] == ["Dice(%)↑ A (paper)", "Dice(%)↑ A Δ"]
    row = real.set_index("Method").loc["FedST"]
    assert row["Dice(%)↑ A"] == "85.00 ± 5.00" and row["Dice(%)↑ A (paper)"] == 84.73
    assert row["Dice(%)↑ A Δ"] == pytest.approx(85.0 - 84.73)
    assert math.isnan(real.set_index("Method").loc["FedAvg", "Dice(%)↑ A (paper)"])  # not printed for FedAvg here
    assert "Table II" in note
    synth, note = R.with_paper(t, "table2", synthetic=True, root=tmp_path)
    assert synth["Dice(%)↑ A Δ"].isna().all() and "left empty" in note


def test_the_typed_paper_tables_load():
    from fedmedbench.report import paper_values as PV

    t9 = PV.load("fedst", "table9")
    assert t9.lookup({"Method": "FedST"}, "Cost (MB/round)") == 12.69 and t9.lookup({"Method": "FedAvg"}, "Cost (MB/round)") == 19.71
    assert PV.load("fedst", "table2").lookup({"Method": "FedST"}, "Dice(%)↑ Avg.") == 82.62
    assert PV.load("fedst", "table8").lookup({"Method": "Upperbound"}, "Dice(%)↑") == 26.46


def test_every_ablation_row_has_the_papers_dice_beside_it():
    """Tables IV-VII: each row label the report prints finds its typed-in paper row (no silent NaN)."""
    runs = _runs().assign(variant="abl_ts")
    for table in ("table4", "table5", "table6", "table7"):
        t = R.table_dice_rows(runs, ["A", "B"], R.ROWS[table], "clip")
        shown, note = R.with_paper(t, table, synthetic=False)
        assert not shown["Dice Avg. (paper)"].isna().any(), table
        assert f"Table {dict(table4='IV', table5='V', table6='VI', table7='VII')[table]} " in note
    t4 = R.with_paper(R.table_dice_rows(runs, ["A", "B"], R.ROWS["table4"], "clip"), "table4", False)[0]
    row = t4.set_index("Setting").loc["+TS"]
    assert row["Dice A (paper)"] == 83.96 and row["Dice E (out fed) (paper)"] == 71.19
    assert row["Dice A Δ"] == pytest.approx(85.0 - 83.96)  # the run's 85.00 ± 5.00 minus the paper's


def test_fig6_points_per_interval_and_site(tmp_path):
    def run(variant, seed, dice):
        d = tmp_path / "ABCD" / variant / "fedst" / f"seed{seed}"
        d.mkdir(parents=True)
        rows = [{"round": r, "client": c, "local_dice": (0.1 if r == 1 else dice[c])} for r in (1, 2) for c in range(2)]
        pd.DataFrame(rows).to_csv(d / "client_metrics.csv", index=False)
        return str(d / "client_metrics.csv")

    files = [run("main", 0, [0.8, 0.6]), run("main", 1, [0.6, 0.6]), run("comm10", 0, [0.5, 0.7])]
    f = R.fig6_frame(files, ["A", "B"], base_steps=100)
    row = f.set_index(["interval", "site"])
    assert row.loc[(100, "A"), "dice_mean"] == pytest.approx(70.0) and row.loc[(100, "A"), "dice_std"] == pytest.approx(10.0)
    assert row.loc[(100, "Avg."), "dice_mean"] == pytest.approx(65.0) and row.loc[(10, "B"), "dice_mean"] == pytest.approx(70.0)
    assert sorted(f["interval"].unique()) == [10, 100]  # last evaluated round only (round 1's 10 % is ignored)


def test_comm_variants_keep_the_total_iterations():
    from fedmedbench.studies.fedst import runs as FS

    cfg = {"train": {"rounds": 300, "local_steps": 100, "batch_size": 2}, "fig6": {"intervals": [10, 100, 500]}}
    assert FS.comm_variants(cfg) == ["comm10", "comm500"]
    assert FS.train_config(cfg, "comm10") == ({"rounds": 3000, "batch_size": 2}, 10)
    assert FS.train_config(cfg, "comm500") == ({"rounds": 60, "batch_size": 2}, 500)
    assert FS.train_config(cfg, "main") == ({"rounds": 300, "batch_size": 2}, 100)


def _per_round_run(root, variant, seed, dice_by_round):
    """client_metrics.csv of a hand-made run: {round: [dice of client 0, client 1]} (unordered rows)."""
    d = root / "ABCD" / variant / "fedst" / f"seed{seed}"
    d.mkdir(parents=True)
    rows = [{"round": r, "client": c, "local_dice": v[c]} for r, v in dice_by_round.items() for c in (1, 0)]
    pd.DataFrame(rows).to_csv(d / "client_metrics.csv", index=False)
    return str(d / "client_metrics.csv")


def test_fig5_dice_per_round_site_and_curve(tmp_path):
    files = [_per_round_run(tmp_path, "main", 0, {1: [0.5, 0.3], 2: [0.8, 0.6]}),
             _per_round_run(tmp_path, "main", 1, {1: [0.7, 0.3], 2: [0.8, 0.6]}),
             _per_round_run(tmp_path, "syn_server", 0, {1: [0.2, 0.4], 2: [0.3, 0.5]}),
             _per_round_run(tmp_path, "syn_sites", 0, {2: [0.1, 0.9]})]
    f = R.fig5_frame(files, ["A", "B"]).set_index(["curve", "site", "round"])
    serq, server, sites = R.FIG5_CURVES["main"], R.FIG5_CURVES["syn_server"], R.FIG5_CURVES["syn_sites"]
    assert f.loc[(serq, "A", 1), "dice_mean"] == pytest.approx(60.0) and f.loc[(serq, "A", 1), "dice_std"] == pytest.approx(10.0)
    assert f.loc[(serq, "A", 1), "seeds"] == 2 and f.loc[(serq, "Avg.", 2), "dice_mean"] == pytest.approx(70.0)
    assert f.loc[(server, "B", 1), "dice_mean"] == pytest.approx(40.0) and f.loc[(server, "Avg.", 2), "dice_mean"] == pytest.approx(40.0)
    assert f.loc[(sites, "B", 2), "dice_mean"] == pytest.approx(90.0)  # client 1 = second site, whatever the row order
    assert (sites, "A", 1) not in f.index  # rounds that were not evaluated are not invented
    assert len(f) == 3 * 2 + 3 * 2 + 3  # (A, B, Avg.) x evaluated rounds, per curve


def test_fig5_rejects_a_run_that_is_no_curve(tmp_path):
    bad = _per_round_run(tmp_path, "abl_ts", 0, {1: [0.5, 0.5]})
    with pytest.raises(ValueError, match="abl_ts"):
        R.fig5_frame([bad], ["A", "B"])


def test_fig7_bars_without_and_with_synthetic_data(tmp_path):
    def run(variant, method, seed, dice):
        d = tmp_path / "ABCD" / variant / method / f"seed{seed}"
        d.mkdir(parents=True)
        rows = [{"round": r, "client": c, "local_dice": (0.05 if r == 1 else dice[c])} for r in (1, 2) for c in (1, 0)]
        pd.DataFrame(rows).to_csv(d / "client_metrics.csv", index=False)
        return str(d / "client_metrics.csv")

    files = [run("synmix", "seg_fedavg", 0, [0.4, 0.2]), run("main", "seg_fedavg", 0, [0.6, 0.4]),
             run("main", "seg_fedavg", 1, [0.8, 0.4]), run("synmix", "fedst", 0, [0.9, 0.7]), run("main", "fedst", 0, [0.7, 0.5])]
    f = R.fig7_frame(files, ["A", "B"], ["fedst", "seg_fedavg"])
    assert list(dict.fromkeys(zip(f["method"], f["synthetic"], strict=True))) == [
        ("FedST", False), ("FedST", True), ("FedAvg", False), ("FedAvg", True)]  # methods in config order, without first
    row = f.set_index(["method", "synthetic", "site"])
    assert row.loc[("FedAvg", False, "A"), "dice_mean"] == pytest.approx(70.0) and row.loc[("FedAvg", False, "A"), "dice_std"] == pytest.approx(10.0)
    assert row.loc[("FedAvg", True, "Avg."), "dice_mean"] == pytest.approx(30.0) and row.loc[("FedAvg", True, "A"), "seeds"] == 1
    assert row.loc[("FedST", True, "B"), "dice_mean"] == pytest.approx(70.0)  # last round only; client order, not row order
    with pytest.raises(ValueError, match="abl_ts"):
        R.fig7_frame([run("abl_ts", "fedst", 0, [0.1, 0.1])], ["A", "B"], ["fedst"])


def test_synmix_doubles_the_iterations_and_mixes_the_server_site():
    from fedmedbench.studies.fedst import runs as FS

    cfg = {"train": {"rounds": 300, "local_steps": 100, "batch_size": 2}, "methods": ["seg_fedavg", "fedst"], "seeds": [0],
           "variants": [], "indicator": {"kind": "onehot"}, "fig5": {"variants": []}, "fig7": {"methods": ["seg_fedavg", "fedrep"]}}
    assert FS.train_config(cfg, "synmix") == ({"rounds": 300, "batch_size": 2}, 200)
    assert ("synmix", "seg_fedavg", 0) in FS.runs(cfg) and not any(m == "fedrep" for _, m, _ in FS.runs(cfg))
    with pytest.raises(ValueError, match="local_steps"):
        FS.train_config({**cfg, "train": {"rounds": 3, "local_steps": None}}, "synmix")


def test_table4_says_per_site_whether_the_clip_history_is_real():
    """The temporal ablation rows carry each site's clip history (site.json's share of repeated history slots):
    real, repeated, or the share repeated; rows without the temporal module say so."""
    history = {"A": 1 / 3, "B": 1 / 3, "C": 0.0, "D": 1.0, "E": 1.0}
    t = R.table_dice_rows(_runs(), ["A", "B"], R.ROWS["table4"], "onehot", history).set_index("Setting")
    assert t.loc["FedST (full)", "Clip history"] == "A 33% repeated, B 33% repeated, C real, D repeated, E repeated"
    assert t.loc["+TS", "Clip history"] == t.loc["FedST (full)", "Clip history"]
    assert t.loc["FedDP baseline", "Clip history"] == t.loc["SERQ only", "Clip history"] == "no temporal module"
    assert "Clip history" not in R.table_dice_rows(_runs(), ["A", "B"], R.ROWS["table5"], "onehot").columns


def test_captions_name_the_scoring_rule_size_and_each_methods_sent_reading():
    note = R.scoring_note({"resolution": "input", "empty_rule": "diagonal"}, [480, 480])
    assert "the input size (480x480)" in note and "image diagonal" in note and "empty_rule: diagonal" in note
    assert "FedDP's one pixel at (0, 0)" in R.scoring_note({"empty_rule": "feddp_pixel"}, [480, 480])
    sent = R.sent_note({"sent": "table_ix", "rsc_communicated": True, "method_params": {}})
    assert "FedST the encoder without its queries + RSC (fedst.sent: table_ix, rsc_communicated: true)" in sent
    assert "every parameter but the encoder queries (method_params.feddp.sent: reference_code)" in sent
    old = R.sent_note({"sent": "table_v", "rsc_communicated": False, "method_params": {"feddp": {"sent": "paper_text"}}})
    assert "the decoder and head (fedst.sent: table_v, rsc_communicated: false)" in old
    assert "FedDP its decoder and head (method_params.feddp.sent: paper_text)" in old
