"""The real-layout readers against the datasets' published counts (UltraFlwr Sec. III-A): m2cai16 10
videos / 2,811 annotated frames, CholecTrack20 without VID30/31 18 videos / 31,226 frames."""

from __future__ import annotations

import pandas as pd
from helpers import surgical as F

from fedmedbench.data.surgical import facts
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import read_index


def _index(tmp_path, name):
    cfg, _ = F.make(tmp_path, name)
    build_index(name, cfg, tmp_path, tmp_path / f"idx_{name}", log=lambda m: None)
    return read_index(tmp_path / f"idx_{name}")[0]


def test_synthetic_layouts_have_the_published_video_counts(tmp_path):
    """Read through the real-layout adapters, the synthetic releases have the published numbers of videos
    (CholecTrack20: 20 in the release, 18 once VID30/31 are left out); their frame counts are small on
    purpose, so the report says they differ."""
    m2 = _index(tmp_path, "m2cai16")
    ct = _index(tmp_path, "cholectrack20")
    assert facts.counts(m2)[0] == facts.PUBLISHED["m2cai16"].videos == 10
    assert ct["video_id"].nunique() == 20
    assert facts.counts(ct, ("VID30", "VID31"))[0] == facts.PUBLISHED["cholectrack20"].videos == 18
    assert "DIFFERS from the published 18 videos, 31226 frames" in facts.report("cholectrack20", ct)


def _hand_made(videos: dict[str, int], unlabelled: int = 0) -> pd.DataFrame:
    rows = [{"video_id": v, "labelled": True} for v, n in videos.items() for _ in range(n)]
    rows += [{"video_id": next(iter(videos)), "labelled": False}] * unlabelled
    return pd.DataFrame(rows)


def test_report_counts_annotated_frames_without_the_excluded_videos():
    m2 = _hand_made({f"v{i:02d}": 281 for i in range(1, 11)} | {"v10": 282}, unlabelled=5)  # 9 x 281 + 282 = 2811
    assert facts.counts(m2) == (10, 2811)
    assert facts.report("m2cai16", m2).startswith("10 videos, 2811 annotated frames: matches")
    ct = _hand_made({f"VID{i:02d}": 1734 for i in range(1, 19)} | {"VID18": 1748, "VID30": 900, "VID31": 10})
    assert facts.counts(ct, ("VID30", "VID31")) == (18, 31226)
    assert "without VID30, VID31: matches" in facts.report("cholectrack20", ct)
    assert "DIFFERS" in facts.report("m2cai16", m2.iloc[1:])  # one annotated frame missing
    assert facts.report("endovis2017", m2) is None
