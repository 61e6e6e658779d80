"""Figures: partition heatmaps and convergence curves (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def partition_heatmap(stats: pd.DataFrame, title: str):
    train = stats[stats["part"] == "train"].sort_values("client")
    cols = [c for c in train.columns if c.startswith("class_")]
    mat = train[cols].to_numpy()
    fig, ax = plt.subplots(figsize=(1.0 + 0.5 * len(cols), 1.0 + 0.35 * len(train)))
    im = ax.imshow(mat, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(cols)), [c.split("_")[1] for c in cols])
    ax.set_yticks(range(len(train)), [f"{c} ({s})" if s != "base" else str(c) for c, s in zip(train["client"], train["source"], strict=True)])
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if mat.size <= 400:
        for (i, j), v in np.ndenumerate(mat):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7, color="w" if v < mat.max() / 2 else "k")
    fig.colorbar(im, ax=ax, label="training samples")
    ax.set_title(title, fontsize=9)
    return fig


def load_curves(paths) -> pd.DataFrame:
    """Concatenate metrics CSVs; dataset/setting/method/seed parsed from results/<study>/<d>/<s>/<m>/seed<k>/."""
    frames = []
    for p in paths:
        p = Path(p)
        method, setting, dataset = p.parent.parent.name, p.parent.parent.parent.name, p.parent.parent.parent.parent.name
        df = pd.read_csv(p)
        df["dataset"], df["setting"], df["method"], df["seed"] = dataset, setting, method, int(p.parent.name[4:])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def convergence(curves: pd.DataFrame, metric: str, study: str, origin: str):
    if metric not in curves:
        raise KeyError(f"report.curve_metric '{metric}' is not a logged metric; available: {sorted(curves.columns)}")
    panels = curves[["dataset", "setting"]].drop_duplicates().values.tolist()
    ncols = min(3, len(panels))
    nrows = int(np.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    for ax, (dataset, setting) in zip(axes.flat, panels, strict=False):
        sub = curves[(curves["dataset"] == dataset) & (curves["setting"] == setting)]
        for method, g in sub.groupby("method", sort=False):
            stats = g.groupby("round")[metric].agg(["mean", "std"]).reset_index()
            ax.plot(stats["round"], stats["mean"], marker="o", ms=3, label=method)
            ax.fill_between(stats["round"], stats["mean"] - stats["std"].fillna(0), stats["mean"] + stats["std"].fillna(0), alpha=0.2)
        ax.set_title(f"{dataset} / {setting}", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    fig.suptitle(f"{study}: {metric} per round{tag}", fontsize=10)
    fig.tight_layout()
    return fig
