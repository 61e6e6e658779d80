"""Video-level train/val/test splits: a video (one procedure) is never in two splits.

UltraFlwr found that m2cai16-tool-locations' original splits are frame-level, so adjacent
(near-identical) frames of one video end up in train and test. Here a dataset's videos
are split by one of three modes (``surgical.groups.<g>.video_splits.<dataset>.mode``):

* ``official``: the release's own split of each video; fails if any video has frames in
  two splits (the leakage), naming the video.
* ``lists``: explicit ``train``/``val``/``test`` video lists (e.g. the re-curated m2cai16 split).
* ``auto``: ``fractions`` of the frames per split, videos drawn in a seeded random order and
  each given to the split furthest below its target.

Videos in no split are unused (reported), never silently mixed in.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedmedbench.data.surgical.schema import SPLITS


class LeakageError(ValueError):
    """A video would appear in two splits (or two clients' training data)."""


def video_lengths(frames: pd.DataFrame) -> pd.Series:
    """Frames per video of one dataset, indexed by video id (sorted)."""
    return frames.groupby("video_id", sort=True).size()


def official(frames: pd.DataFrame, dataset: str) -> dict[str, str]:
    out = {}
    for vid, splits in frames.groupby("video_id", sort=True)["split"]:
        found = sorted(set(splits) - {""})
        if len(found) > 1:
            raise LeakageError(
                f"dataset '{dataset}': the release's splits put frames of video {vid} in {' and '.join(found)} "
                "(temporal leakage between splits). Split by video instead: set "
                f"video_splits.{dataset} to mode: lists (train/val/test video lists) or mode: auto.")
        if found:
            out[vid] = found[0]
    return out


def from_lists(lists: dict, available: list[str], dataset: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for split in SPLITS:
        for vid in lists.get(split) or []:
            vid = str(vid)
            if vid not in available:
                raise ValueError(f"video_splits.{dataset}.{split}: video '{vid}' is not in the index of '{dataset}' "
                                 f"(videos: {', '.join(available)})")
            if vid in out:
                raise LeakageError(f"video_splits.{dataset}: video '{vid}' is listed in both {out[vid]} and {split}")
            out[vid] = split
    return out


def auto(lengths: pd.Series, fractions: list[float], seed: int) -> dict[str, str]:
    fr = np.asarray(fractions, dtype=float)
    if fr.shape != (3,) or (fr < 0).any() or fr.sum() <= 0:
        raise ValueError(f"video_splits auto fractions must be three non-negative numbers, got {fractions}")
    targets = fr / fr.sum() * lengths.sum()
    have = np.zeros(3)
    out = {}
    order = np.random.default_rng(seed).permutation(len(lengths))
    for i in order:
        vid, n = lengths.index[i], int(lengths.iloc[i])
        deficit = np.where(targets > 0, (targets - have) / np.maximum(targets, 1), -np.inf)
        k = int(np.argmax(deficit))
        out[str(vid)] = SPLITS[k]
        have[k] += n
    return out


def resolve(frames: pd.DataFrame, dataset: str, spec: dict | None, seed: int) -> dict[str, str]:
    """video id -> split for one dataset (videos absent from the result are unused)."""
    spec = spec or {"mode": "official"}
    mode = spec.get("mode", "official")
    if mode == "official":
        return official(frames, dataset)
    if mode == "lists":
        return from_lists(spec, sorted(frames["video_id"].unique()), dataset)
    if mode == "auto":
        return auto(video_lengths(frames), spec.get("fractions") or [0.6, 0.2, 0.2], seed)
    raise ValueError(f"video_splits.{dataset}.mode must be official, lists or auto, got '{mode}'")
