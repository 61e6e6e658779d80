"""The synthetic surgical video generator: deterministic, consistent labels, smooth motion, distinct sites."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from helpers import surgical as F

from fedmedbench.data.surgical import synthetic as SY
from fedmedbench.data.surgical import synthetic_layouts as SL
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import read_index


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(F.SPECS))
def test_generator_is_deterministic(tmp_path, name):
    F.make(tmp_path / "one", name, seed=3)
    F.make(tmp_path / "two", name, seed=3)
    F.make(tmp_path / "other", name, seed=4)
    folder = F.SPECS[name][0]["folder"]
    one, two, other = (_digest(tmp_path / d / folder) for d in ("one", "two", "other"))
    assert one == two and len(one) > 5
    assert one != other


def test_boxes_are_the_tool_tips_in_the_masks():
    rng = SY.rng_for(0, "t")
    tracks = SY.detection_tracks(rng, 96, 64, 12, 1.0)
    frames = SY.render_video(rng, SY.STYLES["cholecystectomy_a"], 12, 96, 64, 1.0, tracks)
    n_boxes = 0
    for fr in frames:
        assert fr.image.shape == (64, 96, 3) and fr.image.dtype == np.uint8
        assert set(np.unique(fr.parts)) <= {0, 1, 2, 3}
        for b in fr.boxes:
            n_boxes += 1
            assert 0 <= b.x1 < b.x2 <= 96 and 0 <= b.y1 < b.y2 <= 64
            own = next(p for p, n in zip(fr.tool_parts, fr.tool_names, strict=True) if n == b.cls
                       and (p[int(b.y1):int(b.y2), int(b.x1):int(b.x2)] >= SY.WRIST).any())
            ys, xs = np.nonzero(own >= SY.WRIST)
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (b.x1, b.y1, b.x2, b.y2)
    assert n_boxes > 5


def test_tools_move_smoothly():
    rng = SY.rng_for(0, "motion")
    tracks = [SY.random_track(rng, "grasper", 96, 64, 30, 0.2, always=True)]
    frames = SY.render_video(rng, SY.STYLES["nephrectomy_a"], 30, 96, 64, 0.2, tracks)
    tips = np.array([np.argwhere(f.parts == SY.CLASPER).mean(0) for f in frames])
    steps = np.linalg.norm(np.diff(tips, axis=0), axis=1)
    assert steps.max() < 6.0 and steps.mean() > 0.2  # moving, without jumps between 0.2 s frames


def test_sites_have_their_own_tissue_statistics():
    means = {}
    for name in ("cholecystectomy_a", "nephrectomy_b", "hysterectomy", "lobectomy", "simulator"):
        canvas = SY.tissue(SY.rng_for(0, name), SY.STYLES[name], 96, 64)
        means[name] = canvas.reshape(-1, 3).mean(0)
    names = sorted(means)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert np.abs(means[a] - means[b]).max() > 10, (a, b)
    assert SY.tissue(SY.rng_for(0, "s"), SY.STYLES["simulator"], 96, 64).std() > 0  # flat organs, no noise


@pytest.mark.parametrize("style", ["hysterectomy", "lobectomy", "simulator"])
def test_every_style_indexes_cleanly(tmp_path, style):
    cfg = {"layout": "frames_masks", "folder": "Site", "fps": 5}
    SL.generate("site", cfg, {"style": style, "videos": 2, "test_videos": 1, "frames": [3, 3]}, 0, 64, 48,
                tmp_path / "Site")
    build_index("site", cfg, tmp_path, tmp_path / "idx", log=lambda m: None)
    df, meta = read_index(tmp_path / "idx")
    assert meta["n_bad_files"] == 0 and len(df) == 9 and (tmp_path / "Site" / "SYNTHETIC.txt").is_file()


def test_unknown_style_and_layout_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown synthetic style 'mars'"):
        SL.generate("x", {"layout": "frames_masks", "folder": "X", "fps": 1}, {"style": "mars"}, 0, 64, 48, tmp_path / "X")
    with pytest.raises(ValueError, match="no synthetic writer for layout 'coco'"):
        SL.generate("x", {"layout": "coco", "folder": "X"}, {"style": "simulator"}, 0, 64, 48, tmp_path / "X")
    assert not (tmp_path / "X").exists()


@pytest.mark.parametrize("name", sorted(F.SPECS))
def test_repeated_frames_are_hard_links_of_one_video_at_the_dataset_size(tmp_path, name):
    """``distinct_frames``: a video's frames beyond the first K repeat them in turn, as hard links (no new
    pixels, no new disk), never across videos; ``width``/``height`` give the dataset its own frame size;
    the release indexes as usual, with as many labelled frames as without repeats."""
    cfg, spec = F.SPECS[name]
    plain = {**spec, "width": 80, "height": 40}
    SL.generate(name, cfg, plain, 0, F.W, F.H, tmp_path / "plain" / cfg["folder"])
    SL.generate(name, cfg, {**plain, "distinct_frames": 2}, 0, F.W, F.H, tmp_path / "rep" / cfg["folder"])
    indexed = {}
    for kind in ("plain", "rep"):
        build_index(name, {**cfg, "bad_files": "fail"}, tmp_path / kind, tmp_path / f"idx-{kind}", log=lambda m: None)
        indexed[kind] = read_index(tmp_path / f"idx-{kind}")[0]
    assert len(indexed["rep"]) == len(indexed["plain"]) and indexed["rep"]["labelled"].sum() > 0
    frames = [Path(p) for p in indexed["rep"]["image_path"]]
    assert set(indexed["rep"]["width"]) == {80} and set(indexed["rep"]["height"]) == {40}
    by_video = {}
    for video, path in zip(indexed["rep"]["video_id"], frames, strict=True):
        by_video.setdefault(video, []).append(path.stat().st_ino)
    inodes = [i for v in by_video.values() for i in v]
    assert len(set(inodes)) < len(inodes)  # some frames repeat as links
    for video, own in by_video.items():
        assert len(set(own)) <= 2, video  # K = 2 distinct images per video
        others = {i for v, o in by_video.items() if v != video for i in o}
        assert not set(own) & others, video  # never linked across videos
