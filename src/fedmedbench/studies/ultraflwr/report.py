"""UltraFlwr report: Table I (parameters saved by each PA strategy, from the model), Tables II/III
(top strategies per setting by federated ID mAP50, with centralized ID-C/CD-C), Figure 3
(validation mAP50 per round per strategy) and the measured communication per client and round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.workflow import io

#: the paper's Table I (YOLOv11n, 80 classes): parameters saved per client per round
PAPER_TABLE1 = {"Full Aggregation": 0, "FedBackbone": 1_034_061, "FedNeck": 2_073_798, "FedHead": 2_171_791,
                "FedNeckHead": 1_605_764, "FedBackboneHead": 566_027, "FedBackboneNeck": 468_034}
PAPER_TOTAL = 2_639_825


def table1(cfg: str = "yolo11n.yaml", nc: int = 80) -> pd.DataFrame:
    """Per split and strategy: state_dict elements aggregated and saved (vs full aggregation)."""
    from fedmedbench.fl.tasks.detection.components import PARTS, SPLITS, component_sizes
    from fedmedbench.fl.tasks.detection.yolo import build_yolo

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
    """The full numbers to CSV; the shown view to Markdown and LaTeX with missing values left blank."""
    io.write_csv(csv, frame)
    shown = shown.astype(object).where(shown.notna(), "")
    io.write_text(md, f"{caption}\n\n{shown.to_markdown(index=False)}\n")
    io.write_text(tex, shown.to_latex(index=False, caption=caption.replace("%", r"\%"), label=label, escape=True))


def source_note(origin: str) -> str:
    if origin == "synthetic":
        return "SYNTHETIC surgical videos (demo stand-in; NOT a reproduction of the paper's numbers)"
    return "licensed m2cai16-tool-locations / CholecTrack20 data"


def _final_client_rows(path: str | Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    if df.empty or not any(c.startswith("test") and c.endswith("_map50") for c in df.columns):
        raise ValueError(f"{path}: no per-client-pair detection metrics (test<j>_map50 columns)")
    return df[df["round"] == df["round"].max()]


def collect(runs: list[dict]) -> pd.DataFrame:
    """runs: dicts with setting, strategy, seed and client_metrics path -> final per-client rows."""
    parts = []
    for r in runs:
        df = _final_client_rows(r["clients"])
        parts.append(df.assign(setting=r["setting"], strategy=r["strategy"], seed=r["seed"]))
    return pd.concat(parts, ignore_index=True)


def pair_matrix(rows: pd.DataFrame) -> pd.DataFrame:
    """Long ID/CD matrix: one row per (setting, strategy, seed, model of client i, test split of client j)."""
    tests = sorted({int(c[4:-6]) for c in rows.columns if c.startswith("test") and c.endswith("_map50")})
    parts = []
    for j in tests:
        part = rows[["setting", "strategy", "seed", "client"]].copy()
        part["test_client"] = j
        part["map50"] = rows[f"test{j}_map50"].to_numpy(dtype=float)
        part["map50_95"] = rows.get(f"test{j}_map50_95", pd.Series(np.nan, index=rows.index)).to_numpy(dtype=float)
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out["client"] = out["client"].astype(int)
    return out.sort_values(["setting", "strategy", "seed", "client", "test_client"], kind="stable").reset_index(drop=True)


def id_cd(matrix: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, strategy, seed, client): ID = the diagonal (own test split), CD = the mean over
    the other clients' test splits (j != i), each split weighted equally, for mAP50 and mAP50-95."""
    keys = ["setting", "strategy", "seed", "client"]
    own = matrix["client"] == matrix["test_client"]
    ident = matrix[own].set_index(keys)[["map50", "map50_95"]].add_prefix("local_")
    cross = matrix[~own].groupby(keys)[["map50", "map50_95"]].mean().add_prefix("cd_")
    return ident.join(cross, how="left").reset_index()


def _fmt(values: pd.Series) -> str:
    """mean±std in %, sample std (ddof=1) over the finite values; one value: the mean alone."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return "n/a"
    return f"{100 * v.mean():.1f}" if len(v) == 1 else f"{100 * v.mean():.1f}±{100 * v.std(ddof=1):.1f}"


def _mean_std(values: pd.Series) -> tuple[float, float]:
    """(mean, sample std) in %, rounded to 0.1 as printed; std NaN for fewer than two finite values."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return np.nan, np.nan
    return round(100 * v.mean(), 1), round(100 * v.std(ddof=1), 1) if len(v) > 1 else np.nan


SHOWN = {"local_map50": "ID (%)", "cd_map50": "CD (%)"}
SHOWN_C = {"local_map50": "ID-C (%)", "cd_map50": "CD-C (%)"}


def top_strategies(scores: pd.DataFrame, top_k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``scores``: :func:`id_cd` of the final round. Mean/std (ddof=1) over clients x seeds; strategies
    ranked by federated ID mAP50 within each setting (ties: strategy name order); the top ``top_k``
    are shown (mean and std in %, as the paper prints them), with the per-client centralized
    baseline's ID-C/CD-C on each setting's first row (the paper's Tables II/III)."""
    stats = (scores.groupby(["setting", "strategy"])[["local_map50", "cd_map50"]]
             .agg(["mean", "std", "count"]).reset_index())
    stats.columns = ["_".join(c).strip("_") for c in stats.columns]
    fed = stats[stats["strategy"] != "Centralized"].sort_values(["setting", "strategy"]).copy()
    fed["rank_id"] = fed.groupby("setting")["local_map50_mean"].rank(ascending=False, method="first").astype(int)
    shown = []
    for setting, group in fed.sort_values(["setting", "rank_id"]).groupby("setting"):
        central = scores[(scores["setting"] == setting) & (scores["strategy"] == "Centralized")]
        for i, r in enumerate(group.head(top_k).itertuples(index=False)):
            sel = scores[(scores["setting"] == setting) & (scores["strategy"] == r.strategy)]
            row = {"setting": setting, "Aggregation": r.strategy, "Rank (ID)": r.rank_id}
            for col, name in SHOWN.items():
                row[name], row[f"{name} std"] = _mean_std(sel[col])
            for col, name in SHOWN_C.items():
                first = i == 0 and len(central)
                row[name], row[f"{name} std"] = _mean_std(central[col]) if first else (np.nan, np.nan)
            shown.append(row)
    return fed.sort_values(["setting", "rank_id"]), pd.DataFrame(shown)


def with_paper(shown: pd.DataFrame, group: str, synthetic: bool, root=None) -> tuple[pd.DataFrame, str]:
    """The shown table with the paper's Table II (group combined) / III (track20) beside it: federated
    ID/CD looked up by (setting, Aggregation), centralized ID-C/CD-C by setting (first row only)."""
    from fedmedbench.report import paper_values as PV

    kw = {} if root is None else {"root": root}
    fed_paper = PV.load("ultraflwr", group, **kw)
    central_paper = PV.load("ultraflwr", f"{group}_centralized", **kw)
    out = PV.beside(shown, fed_paper, {v: v for v in SHOWN.values()}, synthetic)
    out = PV.beside(out, central_paper, {v: v for v in SHOWN_C.values()}, synthetic)
    first = ~out["setting"].duplicated()
    for name in SHOWN_C.values():
        out.loc[~first, [f"{name} (paper)", f"{name} Δ"]] = np.nan
    order = [c for c in out.columns if not c.endswith(" std")]
    for name in [*SHOWN.values(), *SHOWN_C.values()]:  # each std right after its mean
        order.insert(order.index(name) + 1, f"{name} std")
    return out[order], PV.note(fed_paper, synthetic)


def matrix_table(matrix: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean over seed sets per (setting, strategy, model i, test j) and a wide view (rows = model of
    client i, columns = test split of client j, mAP50 in %)."""
    mean = (matrix.groupby(["setting", "strategy", "client", "test_client"])[["map50", "map50_95"]]
            .agg(["mean", "std", "count"]).reset_index())
    mean.columns = ["_".join(c).strip("_") for c in mean.columns]
    wide = mean.pivot_table(index=["setting", "strategy", "client"], columns="test_client", values="map50_mean")
    wide = (100 * wide).round(1)
    wide.columns = [f"test {j} mAP50 (%)" for j in wide.columns]
    wide = wide.reset_index().rename(columns={"client": "model of client"})
    return mean, wide


def curves(runs: list[dict]) -> pd.DataFrame:
    """Per setting, strategy and round: validation mAP50 mean/std (ddof=1) over clients x seeds.
    Every point is a client's local model right after its local training (as UltraFlwr logs):
    federated runs: the validation mAP50 of the epoch each client selected that round (comm.csv,
    ``selected_val_map50``); Centralized: the best validation mAP50 within each round-equivalent
    of E epochs (metrics.csv with round, client, cval_map50). One value per point: std 0."""
    parts = []
    for r in runs:
        central = r["strategy"] == "Centralized"
        path, col = (r["metrics"], "cval_map50") if central else (r["comm"], "selected_val_map50")
        df = pd.read_csv(path)
        if not {"round", "client", col} <= set(df.columns):
            raise ValueError(f"{path}: needs columns round, client, {col} (validation mAP50 per client)")
        parts.append(df[["round", "client", col]].rename(columns={col: "cval_map50"})
                     .assign(setting=r["setting"], strategy=r["strategy"], seed=r["seed"]))
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
