"""Published counts of the detection datasets, to check a local copy against.

UltraFlwr (Sec. III-A) states: m2cai16-tool-locations has 10 videos with 2,811 annotated
frames; CholecTrack20 has 18 videos with 31,226 frames once VID30 and VID31 (corrupted
labels) are left out. A copy whose index disagrees is incomplete, a different release or
read wrongly; ``index_surgical`` logs :func:`report` so users can see it on their copy.
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
