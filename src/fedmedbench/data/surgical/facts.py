"""Published facts about the surgical releases: counts of the detection datasets, to check a
local copy against, and the frame rates that time the FedST sites' clip history.

UltraFlwr (Sec. III-A) states: m2cai16-tool-locations has 10 videos with 2,811 annotated
frames; CholecTrack20 has 18 videos with 31,226 frames once VID30 and VID31 (corrupted
labels) are left out. A copy whose index disagrees is incomplete, a different release or
read wrongly; ``index_surgical`` logs :func:`report` so users can see it on their copy.
:data:`FRAME_RATES` says, per release, at what rate its frame numbers count and whether that is
documented, published or assumed (docs/fedst.md, "Clips and frame rate").
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
    sure that is, and where it comes from. Clip history is timed by it: a frame's time is its
    number / ``fps``, and the 0.2 s history slots take the earlier frames nearest those times."""

    fps: float
    basis: str  # "release documentation" | "published description" | "assumed, not verified"
    source: str


#: the one list of the frame rates of the releases the FedST sites read: keyed by layout for releases
#: with their own layout (EndoVis), else by the dataset's ``release`` option (generic frames_masks layout)
FRAME_RATES: dict[str, FrameRate] = {
    "endovis2017": FrameRate(2.0, "release documentation",
                             "EndoVis 2017 robotic instrument segmentation: frames sampled from 30 Hz video at 2 Hz"),
    "endovis2018": FrameRate(2.0, "release documentation",
                             "EndoVis 2018 robotic scene segmentation: video recorded at 60 Hz, subsampled to 2 Hz"),
    "rarp": FrameRate(30.0, "assumed, not verified",
                      "file numbers taken to count source-video frames at 30 fps; the release (FedST's [50], the "
                      "GraSP paper) was not inspected"),
    "hystyt": FrameRate(1.0, "published description",
                        "a published description of Hyst-YT lists 6 videos, 1,973 annotated frames, about 329 s a "
                        "video: 1,973 / (6 x 329 s) = 1.0 frame a second, file numbers taken to count annotated "
                        "frames one a second (the release's file numbering not inspected)"),
    "lobyt": FrameRate(30.0, "assumed, not verified",
                       "file numbers taken to count source-video frames at 30 fps; no description of Lob-YT's "
                       "annotation rate found (FedST Table I: 203 test frames)"),
    "grasp": FrameRate(1.0, "assumed, not verified",
                       "file numbers taken to count seconds; the GraSP release was not inspected"),
    "simulator": FrameRate(1.0, "assumed, not verified",
                           "SISVSE synthetic frames, no video time: 1 s apart, every history slot repeats the frame"),
}


def frame_rate(release: str | None, dataset: str) -> FrameRate | None:
    """The listed frame rate of ``release`` (None: no release named); an unknown name is an error naming the key."""
    if release is None:
        return None
    if release not in FRAME_RATES:
        raise ValueError(f"surgical.datasets.{dataset}.release = {release!r} is not a listed release; "
                         f"choose from {sorted(FRAME_RATES)}")
    return FRAME_RATES[release]
