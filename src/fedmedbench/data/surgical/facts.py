"""Published facts about the surgical releases: counts of the detection datasets and of the FedST
sites (Table I), to check a local copy against, and the frame rates that time the FedST sites' clip history.

UltraFlwr (Sec. III-A) states: m2cai16-tool-locations has 10 videos with 2,811 annotated
frames; CholecTrack20 has 18 videos with 31,226 frames once VID30 and VID31 (corrupted
labels) are left out. A copy whose index disagrees is incomplete, a different release or
read wrongly; ``index_surgical`` logs :func:`report` so users can see it on their copy.
:data:`TABLE_I` holds FedST's Table I train / test frame counts per release; ``export_clips`` (which indexes
each site's labelled frames) warns, naming the site, where a site's count differs (:func:`table_i_check`).
:data:`FRAME_RATES` says, per release, at what rate its frame numbers count, which folder of the release
that rate belongs to, and whether it is documented or unverified (docs/fedst.md, "Sites").
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Facts:
    """What a paper states about a release: video and annotated-frame counts after ``exclude``."""

    videos: int
    frames: int
    exclude: tuple[str, ...]
    source: str


#: keyed by layout (the release format), since dataset names are configurable
PUBLISHED: dict[str, Facts] = {
    "m2cai16": Facts(10, 2811, (), "UltraFlwr Sec. III-A (m2cai16-tool-locations)"),
    "cholectrack20": Facts(18, 31226, ("VID30", "VID31"), "UltraFlwr Sec. III-A (CholecTrack20 without VID30/31)"),
}


def counts(index: pd.DataFrame, exclude: tuple[str, ...] = ()) -> tuple[int, int]:
    """(videos, annotated frames) of a frame index, without the ``exclude`` videos."""
    kept = index[~index["video_id"].astype(str).isin(exclude)]
    return int(kept["video_id"].nunique()), int(kept["labelled"].sum())


def report(layout: str, index: pd.DataFrame) -> str | None:
    """One line comparing the index with the published counts; None for layouts without published counts."""
    facts = PUBLISHED.get(layout)
    if facts is None:
        return None
    videos, frames = counts(index, facts.exclude)
    same = (videos, frames) == (facts.videos, facts.frames)
    without = f" without {', '.join(facts.exclude)}" if facts.exclude else ""
    verdict = "matches" if same else "DIFFERS from"
    return (f"{videos} videos, {frames} annotated frames{without}: {verdict} the published {facts.videos} videos, "
            f"{facts.frames} frames ({facts.source})")


@dataclass(frozen=True)
class FrameRate:
    """The rate a release's frame numbers count at (frames per second of its file numbering), how
    sure that is, where it comes from and which folder of the release it belongs to. Clip history is
    timed by it: a frame's time is its number / ``fps``, and the 0.2 s history slots take the earlier
    frames nearest those times (``export_clips.history_offsets``)."""

    fps: float
    basis: str  # "release documentation" | "unverified"
    source: str
    folder: str = ""


#: the one list of the frame rates of the releases the FedST sites read: keyed by layout for releases
#: with their own layout (EndoVis), else by the dataset's ``release`` option (generic frames_masks layout)
FRAME_RATES: dict[str, FrameRate] = {
    "endovis2017": FrameRate(2.0, "release documentation",
                             "challenge Data page: '8x 225-frame videos ... we sample the frames from 30 Hz video at 2 Hz', "
                             "test '8x 75-frame sequences ... sampled at the same rate'", "instrument_dataset_*/left_frames"),
    "endovis2018": FrameRate(2.0, "unverified",
                             "'recorded at 60 Hz ... subsampled to 2 Hz', as quoted in data/surgical/endovis2018.py; not "
                             "re-found in the challenge pages read", "seq_*/left_frames"),
    "rarp": FrameRate(30.0, "release documentation",
                      "GraSP README (BCV-Uniandes/GraSP README.md:52,80-108): GraSP_30fps frames 'sampled at 30fps', "
                      "named by their 30-fps index; FedST cites GraSP [50] for RARP (that site C is GraSP is not "
                      "verified; SAR-RARP50's frames are named by 60-fps index: fps 60)", "GraSP_30fps/frames"),
    "hystyt": FrameRate(1.0, "unverified",
                        "an unnamed description of Hyst-YT lists 6 videos, 1,973 annotated frames, about 329 s a video: "
                        "1,973 / (6 x 329 s) = 1.0 frame a second (FedST Table I: 998 + 982 = 1,980 frames)"),
    "lobyt": FrameRate(30.0, "unverified",
                       "file numbers taken to count source-video frames at 30 fps; no description of Lob-YT's "
                       "annotation rate found (FedST Table I: 203 test frames)"),
    "grasp": FrameRate(30.0, "release documentation",
                       "GraSP README (BCV-Uniandes/GraSP README.md:52-53,80-108): GraSP_30fps is 'the complete dataset', "
                       "frames 'sampled at 30fps' named by their 30-fps index, masks in annotations/segmentations with "
                       "the same names; GraSP_1fps (frames_1fps) would be fps 1, every history slot repeated",
                       "GraSP_30fps/frames (dense_frames_30fps in earlier releases)"),
    "simulator": FrameRate(1.0, "unverified",
                           "SISVSE synthetic stills (sisvse.github.io), no video time: every history slot repeats the frame"),
}


@dataclass(frozen=True)
class SiteCounts:
    """FedST Table I: a site's training / test frames (None: the site has no such split)."""

    train: int | None
    test: int | None


#: FedST Table I (seed 002, lines 194-199), keyed as :data:`FRAME_RATES`
TABLE_I: dict[str, SiteCounts] = {
    "endovis2017": SiteCounts(1800, 600), "endovis2018": SiteCounts(2235, 997), "rarp": SiteCounts(2023, 1138),
    "hystyt": SiteCounts(998, 982), "lobyt": SiteCounts(None, 203), "simulator": SiteCounts(3600, None),
}


def release_key(dataset_cfg: dict) -> str | None:
    """The key of a dataset in :data:`FRAME_RATES` / :data:`TABLE_I`: its layout when that is a release of its own
    (EndoVis), else its ``release`` option (None: not named)."""
    layout = dataset_cfg.get("layout")
    return layout if layout in FRAME_RATES else dataset_cfg.get("release")


def table_i_check(site: str, release: str | None, found: dict[str, int]) -> list[str]:
    """One warning per split whose labelled frames (``found``: train, test) differ from Table I's; none for a
    release Table I does not list."""
    printed = TABLE_I.get(release or "")
    if printed is None:
        return []
    out = []
    for split in ("train", "test"):
        want, got = getattr(printed, split), int(found.get(split, 0))
        if (want or 0) != got:
            out.append(f"site {site} ({release}): {got:,} {split} frames indexed, FedST Table I prints "
                       f"{'none' if want is None else f'{want:,}'}")
    return out


def frame_rate(release: str | None, dataset: str) -> FrameRate | None:
    """The listed frame rate of ``release`` (None: no release named); an unknown name is an error naming the key."""
    if release is None:
        return None
    if release not in FRAME_RATES:
        raise ValueError(f"surgical.datasets.{dataset}.release = {release!r} is not a listed release; "
                         f"choose from {sorted(FRAME_RATES)}")
    return FRAME_RATES[release]
