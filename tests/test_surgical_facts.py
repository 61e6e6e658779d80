"""The real-layout readers against the datasets' published counts (UltraFlwr Sec. III-A): m2cai16 10
videos / 2,811 annotated frames, CholecTrack20 without VID30/31 18 videos / 31,226 frames; the FedST sites'
training / test frames against Table I."""

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


def test_a_sites_frames_are_checked_against_table_i(tmp_path):
    """FedST Table I's counts (A 1,800 / 600 ... E - / 203, Sisvse 3,600 / -) are checked per site when its clips
    are indexed: a site whose labelled frames differ gets one warning per split naming the site, the count found
    and the count printed; a site that matches, or a release Table I does not list, gets none."""
    from fedmedbench.data.surgical.export_clips import export_sites, labelled_frames

    assert facts.TABLE_I["endovis2017"] == facts.SiteCounts(1800, 600)
    assert (facts.TABLE_I["lobyt"], facts.TABLE_I["simulator"]) == (facts.SiteCounts(None, 203), facts.SiteCounts(3600, None))
    rows = [{"dataset": "ev", "video_id": v, "frame": k, "timestamp_s": k / 2, "image_path": f"{v}/{k}.png",
             "split": split, "labelled": True, "mask_path": f"{v}/{k}m.png"}
            for v, split, n in (("v1", "train", 1000), ("v2", "train", 800), ("v3", "test", 600), ("v9", "test", 300))
            for k in range(n)]
    index = pd.DataFrame(rows)
    meta = {"task": "segmentation", "classes": ["background", "shaft"]}
    clip_cfg = {"num_previous": 3, "interval_s": 0.2, "tolerance_s": 0.1}
    sites = {"A": {"dataset": "ev", "surgery_type": "x", "exclude_videos": ["v9"]}, "A2": {"dataset": "ev", "surgery_type": "x"}}
    summary = export_sites({"ev": (index, meta)}, sites, clip_cfg, tmp_path / "clips", "real")
    found = {s: labelled_frames(info["counts"]) for s, info in summary["sites"].items()}
    assert found == {"A": {"train": 1800, "test": 600}, "A2": {"train": 1800, "test": 900}}
    assert facts.table_i_check("A", "endovis2017", found["A"]) == []
    assert facts.table_i_check("A2", "endovis2017", found["A2"]) == [
        "site A2 (endovis2017): 900 test frames indexed, FedST Table I prints 600"]
    assert facts.table_i_check("E", "lobyt", {"train": 5, "test": 203}) == [
        "site E (lobyt): 5 train frames indexed, FedST Table I prints none"]
    assert facts.table_i_check("G", "grasp", {"train": 1, "test": 1}) == [] == facts.table_i_check("X", None, {})
    assert labelled_frames({"train": {"clips": 3}, "val": {"clips": 2}, "test": {"clips": 4}}) == {"train": 5, "test": 4}
