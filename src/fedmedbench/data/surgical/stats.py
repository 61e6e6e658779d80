"""Per-setting statistics (frames, videos, boxes per class per client and split) and the
distribution figure in the spirit of UltraFlwr's Fig. 1/2."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedmedbench.data.surgical.schema import SPLITS, parse_boxes  # noqa: E402

SPLIT_COLOURS = {"train": "#4c9a2a", "val": "#2a6f9a", "test": "#9a2a6f"}


def setting_stats(frames: pd.DataFrame, classes: list[str], num_clients: int, allowed: list[list[str]]) -> pd.DataFrame:
    """One row per client and split: datasets, videos, frames, boxes (total, removed, per class)."""
    rows = []
    for k in range(num_clients):
        for split in SPLITS:
            g = frames[(frames["client"] == k) & (frames["split"] == split)]
            counts = dict.fromkeys(classes, 0)
            for text in g["boxes"]:
                for b in parse_boxes(text):
                    counts[b.cls] = counts.get(b.cls, 0) + 1
            rows.append({"client": k, "split": split, "datasets": ",".join(sorted(g["dataset"].unique())),
                         "videos": int(g[["dataset", "video_id"]].drop_duplicates().shape[0]), "frames": int(len(g)),
                         "boxes": int(sum(counts.values())), "boxes_removed": int(g["n_removed"].sum()),
                         "classes": "all" if len(allowed[k]) == len(classes) else "+".join(allowed[k]),
                         **{f"boxes_{c}": int(counts.get(c, 0)) for c in classes}})
    return pd.DataFrame(rows)


def distribution_figure(stats: pd.DataFrame, classes: list[str], title: str):
    """Left: frames per split per client (videos annotated); right: training boxes per class per client."""
    clients = sorted(stats["client"].unique())
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 1.2 + 0.9 * len(clients)),
                                   gridspec_kw={"width_ratios": [1.1, 1.0]})
    left = np.zeros(len(clients))
    for split in SPLITS:
        sub = stats[stats["split"] == split].set_index("client").loc[clients]
        ax1.barh(range(len(clients)), sub["frames"], left=left, color=SPLIT_COLOURS[split], label=split)
        for i, (f, v) in enumerate(zip(sub["frames"], sub["videos"], strict=True)):
            if f:
                ax1.text(left[i] + f / 2, i, f"{f}\n{v} vid", ha="center", va="center", fontsize=7, color="white")
        left += sub["frames"].to_numpy()
    train = stats[stats["split"] == "train"].set_index("client").loc[clients]
    ax1.set_yticks(range(len(clients)), [f"client {c}\n{train.loc[c, 'datasets']}" for c in clients], fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlabel("frames")
    ax1.legend(fontsize=7, loc="lower right")
    width = 0.8 / max(1, len(clients))
    for i, c in enumerate(clients):
        vals = [train.loc[c, f"boxes_{cls}"] for cls in classes]
        label = f"client {c}" + ("" if train.loc[c, "classes"] == "all" else f" ({train.loc[c, 'classes']})")
        ax2.bar(np.arange(len(classes)) + i * width, vals, width, label=label)
    ax2.set_xticks(np.arange(len(classes)) + width * (len(clients) - 1) / 2, classes, rotation=30, fontsize=7)
    ax2.set_ylabel("training boxes")
    ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
