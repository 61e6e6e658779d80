"""UltraFlwr report: Table I (parameters saved by each PA strategy, from the model), Tables II/III
(top strategies per setting by federated ID mAP50, with centralized ID-C/CD-C), Figure 3
(validation mAP50 per round per strategy) and the measured communication per client and round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench import io

#: the paper's Table I (YOLOv11n, 80 classes): parameters saved per client per round
PAPER_TABLE1 = {"Full Aggregation": 0, "FedBackbone": 1_034_061, "FedNeck": 2_073_798, "FedHead": 2_171_791,
                "FedNeckHead": 1_605_764, "FedBackboneHead": 566_027, "FedBackboneNeck": 468_034}
PAPER_TOTAL = 2_639_825


def table1(cfg: str = "yolo11n.yaml", nc: int = 80) -> pd.DataFrame:
    """Per split and strategy: state_dict elements aggregated and saved (vs full aggregation)."""
    from fedmedbench.fl.detection.components import PARTS, SPLITS, component_sizes
    from fedmedbench.fl.detection.yolo import build_yolo

    model = build_yolo(cfg, nc, seed=0)
    rows = []
    for split in SPLITS:
        sizes = component_sizes(model, split)
        sent = component_sizes(model, split, learnt_only=True)
        total = sum(sizes.values())
        for prefix, parts in PARTS.items():
            name = "Full Aggregation" if prefix == "Fed" else prefix
            aggregated = sum(sizes[p] for p in parts)
            paper = PAPER_TABLE1[name] if cfg == "yolo11n.yaml" and nc == 80 else None
            rows.append({"split": split, "strategy": name, "total": total, "aggregated": aggregated,
                         "saved": total - aggregated, "saved_pct": round(100 * (total - aggregated) / total, 2),
                         "sent_fp32_bytes": 4 * sum(sent[p] for p in parts),
                         "paper_saved": paper, "matches_paper": None if paper is None else paper == total - aggregated})
    return pd.DataFrame(rows)


def write_table(frame: pd.DataFrame, shown: pd.DataFrame, caption: str, csv, md, tex, label: str) -> None:
    io.write_csv(csv, frame)
    io.write_text(md, f"{caption}\n\n{shown.to_markdown(index=False)}\n")
    io.write_text(tex, shown.to_latex(index=False, caption=caption.replace("%", r"\%"), label=label, escape=True))


def source_note(origin: str) -> str:
    if origin == "synthetic":
        return "SYNTHETIC surgical videos (demo stand-in; NOT a reproduction of the paper's numbers)"
    return "licensed m2cai16-tool-locations / CholecTrack20 data"


def _final_client_rows(path: str | Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    if df.empty or "local_map50" not in df:
        raise ValueError(f"{path}: no per-client detection metrics (local_map50)")
    return df[df["round"] == df["round"].max()]


def collect(runs: list[dict]) -> pd.DataFrame:
    """runs: dicts with setting, strategy, seed and client_metrics path -> final per-client rows."""
    parts = []
    for r in runs:
        df = _final_client_rows(r["clients"])
        parts.append(df.assign(setting=r["setting"], strategy=r["strategy"], seed=r["seed"]))
    return pd.concat(parts, ignore_index=True)


def _fmt(values: pd.Series) -> str:
    """mean±std in %, sample std (ddof=1) over the finite values; one value: the mean alone."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return "n/a"
    return f"{100 * v.mean():.1f}" if len(v) == 1 else f"{100 * v.mean():.1f}±{100 * v.std(ddof=1):.1f}"


def top_strategies(rows: pd.DataFrame, top_k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean/std (ddof=1) over clients x seeds; strategies ranked by federated ID mAP50 within each
    setting (ties: strategy name order); the top ``top_k`` are shown, with the per-client centralized
    baseline's ID-C/CD-C on each setting's first row (the paper's Tables II/III)."""
    stats = (rows.groupby(["setting", "strategy"])[["local_map50", "cd_map50"]]
             .agg(["mean", "std", "count"]).reset_index())
    stats.columns = ["_".join(c).strip("_") for c in stats.columns]
    fed = stats[stats["strategy"] != "Centralized"].sort_values(["setting", "strategy"]).copy()
    fed["rank_id"] = fed.groupby("setting")["local_map50_mean"].rank(ascending=False, method="first").astype(int)
    shown = []
    for setting, group in fed.sort_values(["setting", "rank_id"]).groupby("setting"):
        central = rows[(rows["setting"] == setting) & (rows["strategy"] == "Centralized")]
        for i, r in enumerate(group.head(top_k).itertuples(index=False)):
            sel = rows[(rows["setting"] == setting) & (rows["strategy"] == r.strategy)]
            shown.append({"Setting": setting, "Aggregation": r.strategy, "Rank (ID)": r.rank_id,
                          "mAP50 ID (%)": _fmt(sel["local_map50"]), "mAP50 CD (%)": _fmt(sel["cd_map50"]),
                          "mAP50 ID-C (%)": _fmt(central["local_map50"]) if i == 0 and len(central) else "",
                          "mAP50 CD-C (%)": _fmt(central["cd_map50"]) if i == 0 and len(central) else ""})
    return fed.sort_values(["setting", "rank_id"]), pd.DataFrame(shown)


def curves(runs: list[dict]) -> pd.DataFrame:
    """Per setting, strategy and round: validation mAP50 mean/std (ddof=1) over clients x seeds.
    Federated runs: each client's own validation split after every round (client_metrics.csv);
    Centralized: each client's validation mAP50 at the end of every round-equivalent (E epochs,
    metrics.csv with round, client, cval_map50). One value per point: std 0."""
    parts = []
    for r in runs:
        path = r["metrics"] if r["strategy"] == "Centralized" else r["clients"]
        df = pd.read_csv(path)
        if not {"round", "client", "cval_map50"} <= set(df.columns):
            raise ValueError(f"{path}: needs columns round, client, cval_map50 (validation mAP50 per client)")
        parts.append(df[["round", "client", "cval_map50"]].assign(setting=r["setting"], strategy=r["strategy"],
                                                                   seed=r["seed"]))
    all_rows = pd.concat(parts, ignore_index=True).dropna(subset=["cval_map50"])
    out = all_rows.groupby(["setting", "strategy", "round"])["cval_map50"].agg(["mean", "std", "count"]).reset_index()
    return out.fillna({"std": 0.0})


def figure3(curve: pd.DataFrame, group: str, origin: str, target) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted(curve["setting"].unique())
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(settings), figsize=(max(6.0, 4.2 * len(settings)), 3.8), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        sub = curve[curve["setting"] == setting]
        for strategy, g in sub.groupby("strategy"):
            style = "--" if strategy == "Centralized" else "-"
            ax.plot(g["round"], 100 * g["mean"], style, marker="o", ms=3, label=strategy)
            ax.fill_between(g["round"], 100 * (g["mean"] - g["std"]), 100 * (g["mean"] + g["std"]), alpha=0.12)
        ax.set_title(f"G_{group}-{setting}")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("validation mAP50 (%)")
    axes[0][-1].legend(fontsize=6, loc="best")
    title = f"UltraFlwr Figure 3, group {group}: validation mAP50 per round (mean ± std over clients x seeds)"
    if origin == "synthetic":
        title += "\nSYNTHETIC data - not the paper's numbers"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.92))  # keep the two-line title clear of the panel titles
    io.save_figure(target, fig)
    plt.close(fig)


def communication(comm_runs: list[dict]) -> pd.DataFrame:
    """Measured bytes sent per client per round (rounds where the client sent anything) per strategy."""
    rows = []
    for r in comm_runs:
        df = pd.read_csv(r["comm"])
        if df.empty:
            continue
        sent = df[df["bytes_sent"] > 0]
        rows.append({"group": r["group"], "setting": r["setting"], "strategy": r["strategy"], "seed": r["seed"],
                     "bytes_per_client_round": int(round(sent["bytes_sent"].mean())) if len(sent) else 0,
                     "elements_per_client_round": int(round(sent["elements_sent"].mean())) if len(sent) else 0,
                     "rounds_without_upload": int(df.groupby("round")["bytes_sent"].sum().eq(0).sum()),
                     "total_bytes": int(df["bytes_sent"].sum())})
    return pd.DataFrame(rows)
