"""Segmentation clips per site for FedST: current frame + previous frames at a fixed time spacing.

FedST feeds the current frame with its three immediately preceding frames 0.2 s apart;
"for the initial frames where sufficient history is unavailable, we duplicate the
current frame". For every labelled frame at time t and k = num_previous .. 1 the clip
takes the earlier frame of the same video and split whose timestamp is nearest to
t - k * interval_s, provided it lies within tolerance_s of it; otherwise the current frame
is duplicated in that slot (counted in ``n_duplicated``). Unlabelled frames (no mask)
serve as history only; a site's ``exclude_videos`` are left out entirely (FedST's site A
tests on the 8 continuation sequences of EndoVis2017 only, Table I). Releases annotated at 2 Hz (EndoVis) have no frame 0.2 s back
unless the intermediate video frames are added to the dataset as unlabelled frames.

Output (``<out>/``, written atomically)::

    <site>/clips.parquet   site, dataset, split, video_id, frame, timestamp_s,
                           clip_paths (oldest .. current), clip_offsets_s, n_duplicated, mask_path
    <site>/site.json       dataset, role, surgery type, the text prompt, label set and classes,
                           clip settings, counts per split
    sites.json             all sites
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.data.surgical.fsutil import atomic_dir

ROLES = ("federated", "out_of_federation", "server")
DEFAULT_PROMPT = "This is the Local site {site} model and the surgery type is {surgery_type}"


def _nearest_before(ts: np.ndarray, i: int, target: float) -> int:
    """Index of the frame among ts[:i] (sorted) whose time is nearest to target; -1 when i == 0."""
    if i == 0:
        return -1
    j = int(np.searchsorted(ts[:i], target))
    candidates = [c for c in (j - 1, j) if 0 <= c < i]
    return min(candidates, key=lambda c: (abs(ts[c] - target), -c))


def build_clips(index: pd.DataFrame, num_previous: int, interval_s: float, tolerance_s: float) -> pd.DataFrame:
    """One row per labelled frame with the paths of its clip (oldest first, current last)."""
    if index["timestamp_s"].isna().any():
        raise ValueError(f"dataset '{index['dataset'].iloc[0]}' has no timestamps: set surgical.datasets.<name>.fps")
    rows = []
    for (split, vid), g in index.groupby(["split", "video_id"], sort=True):
        g = g.sort_values("timestamp_s", kind="stable")
        ts = g["timestamp_s"].to_numpy()
        paths = g["image_path"].tolist()
        for i, row in enumerate(g.itertuples(index=False)):
            if not row.labelled:
                continue
            t = ts[i]
            clip, offsets, dup = [], [], 0
            for k in range(num_previous, 0, -1):
                j = _nearest_before(ts, i, t - k * interval_s)
                if j >= 0 and abs(ts[j] - (t - k * interval_s)) <= tolerance_s + 1e-9:
                    clip.append(paths[j])
                    offsets.append(round(float(ts[j] - t), 6))
                else:
                    clip.append(row.image_path)
                    offsets.append(0.0)
                    dup += 1
            clip.append(row.image_path)
            offsets.append(0.0)
            rows.append({"dataset": row.dataset, "split": split, "video_id": vid, "frame": int(row.frame),
                         "timestamp_s": float(t), "clip_paths": clip, "clip_offsets_s": offsets, "n_duplicated": dup,
                         "mask_path": row.mask_path})
    return pd.DataFrame(rows)


def history_offsets(fps: float, num_previous: int = 3, interval_s: float = 0.2, tolerance_s: float = 0.1) -> list[float]:
    """The history slots (oldest first, seconds from the current frame; 0.0 = the current frame repeated) that
    :func:`build_clips` gives a labelled frame with enough history in a sequence of frames ``1 / fps`` apart."""
    n = int(math.ceil(num_previous * interval_s * fps)) + 2
    index = pd.DataFrame({"dataset": "x", "split": "train", "video_id": "v", "frame": range(n),
                          "timestamp_s": [i / fps for i in range(n)], "image_path": [str(i) for i in range(n)],
                          "labelled": [i == n - 1 for i in range(n)], "mask_path": ""})
    return list(build_clips(index, num_previous, interval_s, tolerance_s)["clip_offsets_s"].iloc[0][:-1])


def history_text(offsets: list[float]) -> str:
    """What a clip's history holds, in words: real earlier frames (their offsets), repeated, or both."""
    real = [o for o in offsets if o != 0.0]
    if not real:
        return "repeated"
    text = f"real earlier frames ({', '.join(f'{o:g}' for o in real)} s)"
    repeated = len(offsets) - len(real)
    return text + (f", {repeated} slot{'s' if repeated > 1 else ''} repeated" if repeated else "")


def labelled_frames(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """A site's labelled frames (its clips) as Table I counts them: train (the train and val splits) and test."""
    return {"train": sum(counts.get(s, {}).get("clips", 0) for s in ("train", "val")),
            "test": counts.get("test", {}).get("clips", 0)}


def export_sites(indices: dict[str, tuple[pd.DataFrame, dict]], sites: dict[str, dict], clip_cfg: dict,
                 out_dir: str | Path, origin: str) -> dict:
    """Write the clip index and metadata of every site (``surgical.sites``) into ``out_dir`` atomically."""
    n_prev, interval, tol = int(clip_cfg["num_previous"]), float(clip_cfg["interval_s"]), float(clip_cfg["tolerance_s"])
    template = clip_cfg.get("prompt_template") or DEFAULT_PROMPT
    summary = {"origin": origin, "clip": {"num_previous": n_prev, "interval_s": interval, "tolerance_s": tol},
               "sites": {}}
    with atomic_dir(out_dir) as tmp:
        for site, cfg in sites.items():
            df, meta = indices[cfg["dataset"]]
            if meta.get("task") != "segmentation":
                raise ValueError(f"site '{site}': dataset '{cfg['dataset']}' is not a segmentation dataset")
            if cfg.get("role", "federated") not in ROLES:
                raise ValueError(f"site '{site}': role must be one of {ROLES}")
            excluded = sorted(cfg.get("exclude_videos") or [])
            unknown = sorted(set(excluded) - set(df["video_id"].astype(str)))
            if unknown:
                raise ValueError(f"site '{site}': exclude_videos {unknown} are not videos of dataset '{cfg['dataset']}'")
            df = df[~df["video_id"].astype(str).isin(excluded)]
            clips = build_clips(df, n_prev, interval, tol)
            if clips.empty:
                raise ValueError(f"site '{site}': dataset '{cfg['dataset']}' has no labelled frame")
            clips.insert(0, "site", site)
            (tmp / site).mkdir()
            clips.to_parquet(tmp / site / "clips.parquet", index=False)
            counts = {s: {"clips": int(len(g)), "videos": int(g["video_id"].nunique()),
                          "fully_duplicated": int((g["n_duplicated"] == n_prev).sum())}
                      for s, g in clips.groupby("split")}
            info = {"site": site, "dataset": cfg["dataset"], "role": cfg.get("role", "federated"),
                    "surgery_type": cfg["surgery_type"], "prompt": template.format(site=site, **cfg),
                    "label_set": meta.get("label_set"), "classes": meta["classes"], "fps": meta.get("fps"),
                    "fps_source": meta.get("fps_source"), "origin": origin, "num_previous": n_prev,
                    "interval_s": interval, "tolerance_s": tol, "excluded_videos": excluded, "counts": counts,
                    "history_duplicated_fraction": round(float(clips["n_duplicated"].sum()) / max(1, n_prev * len(clips)), 4)
                    if n_prev else 0.0}
            (tmp / site / "site.json").write_text(json.dumps(info, indent=1) + "\n")
            summary["sites"][site] = info
        (tmp / "sites.json").write_text(json.dumps(summary, indent=1, default=_nan_none) + "\n")
    return summary


def _nan_none(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(type(obj).__name__)
