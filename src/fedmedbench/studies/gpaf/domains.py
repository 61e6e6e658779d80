"""The client imaging domains side by side (GPAF paper Fig. 2): pixel-intensity profiles per client and class.

Domain files are corrupted copies of one base file, image for image, so the same index shows
the same image in every domain. :func:`intensity_profiles` gives, per domain and class, the
distribution of grey levels of the split's images (density over ``bins`` equal bins of 0..255)
with its mean and standard deviation; :func:`domain_figure` draws one example image per class
and domain above one histogram panel per class.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def grey(images: np.ndarray) -> np.ndarray:
    """(N, H, W) grey levels; RGB images are averaged over channels."""
    return images.astype(float) if images.ndim == 3 else images.astype(float).mean(axis=-1)


def intensity_profiles(domains: dict[str, dict[str, np.ndarray]], split: str = "train", bins: int = 32) -> pd.DataFrame:
    """One row per (domain, class, bin): density of grey levels, plus the class's mean and std per domain."""
    edges = np.linspace(0, 256, bins + 1)
    rows = []
    for name, data in domains.items():
        images, labels = grey(data[f"{split}_images"]), np.asarray(data[f"{split}_labels"]).reshape(-1)
        for c in np.unique(labels):
            pixels = images[labels == c].ravel()
            density, _ = np.histogram(pixels, bins=edges, density=True)
            for lo, hi, d in zip(edges[:-1], edges[1:], density, strict=True):
                rows.append({"domain": name, "class": int(c), "bin_low": lo, "bin_high": hi, "density": float(d),
                             "mean": float(pixels.mean()), "std": float(pixels.std())})
    return pd.DataFrame(rows)


def example_indices(labels: np.ndarray, classes: list[int]) -> dict[int, int]:
    """The first image of each class: the same image shown in every domain."""
    labels = np.asarray(labels).reshape(-1)
    return {c: int(np.flatnonzero(labels == c)[0]) for c in classes if (labels == c).any()}


def domain_figure(domains: dict[str, dict[str, np.ndarray]], profiles: pd.DataFrame, title: str,
                  class_names: tuple[str, ...] = (), split: str = "train", max_classes: int = 4):
    names = list(domains)
    classes = sorted(profiles["class"].unique().tolist())[:max_classes]
    first = domains[names[0]]
    examples = example_indices(first[f"{split}_labels"], classes)
    fig = plt.figure(figsize=(4.2 * len(classes), 6.0))
    grid = fig.add_gridspec(2, len(classes), height_ratios=[1.3, 2.2])
    cmap = plt.get_cmap("tab10")
    for j, c in enumerate(classes):
        label = class_names[c] if c < len(class_names) else f"class {c}"
        strip = grid[0, j].subgridspec(1, len(names), wspace=0.05)
        for i, name in enumerate(names):
            ax = fig.add_subplot(strip[0, i])
            img = domains[name][f"{split}_images"][examples[c]]
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"client {i}\n{name}", fontsize=7)
        ax = fig.add_subplot(grid[1, j])
        for i, name in enumerate(names):
            p = profiles[(profiles["domain"] == name) & (profiles["class"] == c)]
            centres = (p["bin_low"] + p["bin_high"]) / 2
            ax.plot(centres, p["density"], color=cmap(i), label=f"client {i} {name} (mean {p['mean'].iloc[0]:.0f}, "
                                                                 f"sd {p['std'].iloc[0]:.0f})")
        ax.set_title(f"({chr(97 + j)}) {label}", fontsize=9)
        ax.set_xlabel("pixel intensity")
        ax.set_ylabel("density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return fig
