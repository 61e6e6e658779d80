"""Video-level re-curation and every UltraFlwr client setting: leakage, disjointness, fixed eval splits,
class restrictions, balance, determinism."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import surgical as F

from fedmedbench.data.surgical import recurate as R
from fedmedbench.data.surgical import splits as S
from fedmedbench.data.surgical.group_io import read_setting, write_group
from fedmedbench.data.surgical.index import build_index
from fedmedbench.data.surgical.schema import parse_boxes, read_index

EXCL = {"cholectrack20": ["VID30", "VID31"]}
COMBINED = {"datasets": ["m2cai16", "cholectrack20"], "num_clients": 3, "seed": 0, "exclude_videos": EXCL,
            "video_splits": {"m2cai16": F.M2_SPLITS, "cholectrack20": F.CT20_SPLITS},
            "eval_sources": [["m2cai16"], ["cholectrack20"], ["cholectrack20"]], "pool_from": "b",
            "settings": {"a": {"scheme": "iid"}, "b": {"scheme": "curation"},
                         "c": {"scheme": "lmo", "base": "a", "client_classes": ["all", "energy", "cold"]}}}
TRACK20 = {"datasets": ["cholectrack20"], "num_clients": 3, "seed": 0, "exclude_videos": EXCL,
           "video_splits": {"cholectrack20": F.CT20_SPLITS},
           "settings": {"a": {"scheme": "iid"}, "b": {"scheme": "length"},
                        "c": {"scheme": "lmo", "base": "a", "client_classes": ["all", "energy", "cold"]},
                        "d": {"scheme": "lmo", "base": "b", "client_classes": ["all", "energy", "cold"]}}}


@pytest.fixture(scope="module")
def indices(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    out = {}
    for name in ("m2cai16", "cholectrack20"):
        cfg, _ = F.make(root, name)
        build_index(name, cfg, root, root.parent / f"idx_{name}", log=lambda m: None)
        out[name] = read_index(root.parent / f"idx_{name}")
    return out


def _build(indices, name, cfg):
    return R.build_group(name, {k: v[0] for k, v in indices.items()}, {k: v[1] for k, v in indices.items()}, cfg,
                         F.TOOL_GROUPS)


@pytest.fixture(scope="module")
def combined(indices):
    return _build(indices, "combined", COMBINED)


@pytest.fixture(scope="module")
def track20(indices):
    return _build(indices, "track20", TRACK20)


def _videos(df, **where):
    for k, v in where.items():
        df = df[df[k] == v]
    return set(map(tuple, df[["dataset", "video_id"]].drop_duplicates().to_numpy()))


def _assert_clean(group):
    """The leakage properties every setting of every group must have."""
    evals = {}
    for st in group.settings.values():
        df = st.frames
        tr, va, te = (_videos(df, split=s) for s in ("train", "val", "test"))
        assert not (tr & va) and not (tr & te) and not (va & te), "a video is in two splits"
        per_client_train = [_videos(df, split="train", client=k) for k in range(group.num_clients)]
        for i in range(group.num_clients):
            assert per_client_train[i], f"client {i} has no training video"
            for j in range(i + 1, group.num_clients):
                assert not (per_client_train[i] & per_client_train[j]), "two clients share a training video"
        assert not (_videos(df) & set(group.excluded)), "an excluded video is used"
        evals[st.name] = {(k, s): _videos(df, client=k, split=s) for k in range(group.num_clients) for s in ("val", "test")}
    first = next(iter(evals.values()))
    assert all(e == first for e in evals.values()), "val/test differ between settings of the group"
    assert all(first[(k, s)] for k in range(group.num_clients) for s in ("val", "test"))


def test_combined_group_has_no_leakage(combined):
    _assert_clean(combined)
    assert {"VID30", "VID31"} == {v for _, v in combined.excluded}


def test_track20_group_has_no_leakage(track20):
    _assert_clean(track20)


def test_combined_eval_splits_follow_the_curation(combined):
    a = combined.settings["a"].frames
    assert _videos(a, client=0, split="test") == {("m2cai16", "v09"), ("m2cai16", "v10")}
    assert {d for d, _ in _videos(a, client=1, split="val") | _videos(a, client=2, split="test")} == {"cholectrack20"}


def test_curation_setting_separates_datasets_and_pools_the_iid_setting(combined):
    b, a = combined.settings["b"].frames, combined.settings["a"].frames
    assert {d for d, _ in _videos(b, client=0, split="train")} == {"m2cai16"}
    for k in (1, 2):
        assert {d for d, _ in _videos(b, client=k, split="train")} == {"cholectrack20"}
    # G_combined-a redistributes exactly the training videos of G_combined-b
    assert _videos(a, split="train") == _videos(b, split="train") == set(combined.pool)


def test_combined_uses_every_training_video(combined, tmp_path):
    """No training video is left out in any G_combined setting, and the stats table's per-client training
    frame counts are those of the videos each client holds; CholecTrack20's two clients are balanced
    within one video."""
    from fedmedbench.data.surgical.stats import setting_stats

    all_train = {v for v, s in combined.video_split.items() if s == "train"}
    for st in combined.settings.values():
        used = [v for c in st.train for v in c]
        assert sorted(used) == sorted(all_train), st.name  # every one, none twice
        assert combined.unused(st) == []
        stats = setting_stats(st.frames, combined.classes, combined.num_clients, st.classes)
        frames = stats[stats["split"] == "train"].set_index("client")["frames"]
        assert [int(frames[k]) for k in range(3)] == [sum(combined.lengths[v] for v in c) for c in st.train]
    b = combined.settings["b"]
    loads = [sum(combined.lengths[v] for v in c) for c in b.train]
    longest = max(n for v, n in combined.lengths.items() if v[0] == "cholectrack20")
    assert abs(loads[1] - loads[2]) <= longest, loads
    write_group(combined, tmp_path / "g", "synthetic")
    for name in combined.settings:
        assert "videos used by no client: 0 []" in (tmp_path / "g" / name / "stats.md").read_text()


def test_match_lengths_option_fills_towards_the_smallest_client(indices):
    cfg = {**COMBINED, "pool_from": None, "settings": {"b": {"scheme": "curation", "match_lengths": True}}}
    group = _build(indices, "combined", cfg)
    b = group.settings["b"]
    loads = [sum(group.lengths[v] for v in c) for c in b.train]
    assert max(loads) - min(loads) <= max(group.lengths.values()), loads
    full = _build(indices, "combined", {**COMBINED, "pool_from": None, "settings": {"b": {"scheme": "curation"}}})
    assert sum(loads) < sum(sum(full.lengths[v] for v in c) for c in full.settings["b"].train)
    assert group.unused(b)  # the option leaves CholecTrack20 videos out


@pytest.mark.parametrize("group_name,setting,base", [("combined", "c", "a"), ("track20", "c", "a"), ("track20", "d", "b")])
def test_lmo_restricts_training_classes_only(request, group_name, setting, base):
    group = request.getfixturevalue(group_name)
    lmo, ref = group.settings[setting].frames, group.settings[base].frames
    assert _videos(lmo, split="train") == _videos(ref, split="train")
    allowed = {0: set(group.classes), 1: set(F.TOOL_GROUPS["energy"]), 2: set(F.TOOL_GROUPS["cold"])}
    for k, keep in allowed.items():
        tr = lmo[(lmo["client"] == k) & (lmo["split"] == "train")]
        seen = {b.cls for text in tr["boxes"] for b in parse_boxes(text)}
        assert seen <= keep, (k, seen - keep)
        before = sum(len(parse_boxes(t)) for t in ref[(ref["client"] == k) & (ref["split"] == "train")]["boxes"])
        after = sum(len(parse_boxes(t)) for t in tr["boxes"])
        assert before == after + int(tr["n_removed"].sum())
    removed = int(lmo[lmo["client"] > 0]["n_removed"].sum())
    assert removed > 0, "the fixture should exercise the restriction"
    for split in ("val", "test"):  # evaluation annotations stay complete
        assert lmo[lmo["split"] == split]["boxes"].tolist() == ref[ref["split"] == split]["boxes"].tolist()


def test_length_setting_sorts_clients_long_to_short(track20):
    b = track20.settings["b"]
    lens = [[track20.lengths[v] for v in c] for c in b.train]
    for k in range(len(lens) - 1):
        assert min(lens[k]) >= max(lens[k + 1]), lens


def test_length_balance_frames_vs_videos():
    lengths = {("d", f"v{i}"): n for i, n in enumerate([40, 30, 10, 9, 8, 7, 6, 5, 4, 3])}
    pool = sorted(lengths)
    by_frames = R.scheme_length(pool, lengths, 3, "frames")
    by_videos = R.scheme_length(pool, lengths, 3, "videos")
    totals = lambda parts: [sum(lengths[v] for v in p) for p in parts]  # noqa: E731
    assert totals(by_frames) == [40, 40, 42] and [len(p) for p in by_videos] == [4, 3, 3]


def test_iid_is_balanced_and_seeded():
    rng = np.random.default_rng(0)
    lengths = {("d", f"v{i:02d}"): int(n) for i, n in enumerate(rng.integers(10, 60, 30))}
    pool = sorted(lengths)
    a = R.scheme_iid(pool, lengths, 3, seed=1)
    loads = [sum(lengths[v] for v in c) for c in a]
    assert max(loads) - min(loads) <= 60 and sorted(v for c in a for v in c) == pool
    assert a == R.scheme_iid(pool, lengths, 3, seed=1) and a != R.scheme_iid(pool, lengths, 3, seed=2)


def test_official_m2cai16_splits_are_rejected_as_leaky(indices):
    df = indices["m2cai16"][0]
    with pytest.raises(S.LeakageError, match=r"video v\d+ in .* and"):
        S.official(df, "m2cai16")


def test_official_cholectrack20_splits_are_video_level(indices):
    out = S.official(indices["cholectrack20"][0], "cholectrack20")
    assert out["VID12"] == "test" and out["VID02"] == "train" and out["VID110"] == "val"


def test_split_lists_errors(indices):
    df = indices["m2cai16"][0]
    with pytest.raises(S.LeakageError, match="listed in both"):
        S.resolve(df, "m2cai16", {"mode": "lists", "train": ["v01"], "test": ["v01"]}, 0)
    with pytest.raises(ValueError, match="'v99' is not in the index"):
        S.resolve(df, "m2cai16", {"mode": "lists", "train": ["v99"]}, 0)


def test_auto_split_covers_all_videos_once(indices):
    df = indices["cholectrack20"][0]
    out = S.resolve(df, "cholectrack20", {"mode": "auto", "fractions": [0.6, 0.2, 0.2]}, 3)
    assert set(out) == set(df["video_id"]) and set(out.values()) == {"train", "val", "test"}


def test_frame_step_subsamples_each_video(indices):
    cfg = {**TRACK20, "frame_step": {"cholectrack20": 2}}
    frames, _ = R.prepare_frames({"cholectrack20": indices["cholectrack20"][0]}, cfg)
    full = indices["cholectrack20"][0]
    full = full[~full["video_id"].isin(EXCL["cholectrack20"])]
    want = full.groupby("video_id").size().apply(lambda n: (n + 1) // 2)
    assert frames.groupby("video_id").size().sort_index().tolist() == want.sort_index().tolist()


def test_config_errors(indices):
    with pytest.raises(ValueError, match="1 val video"):
        _build(indices, "g", {**TRACK20, "video_splits": {"cholectrack20": {**F.CT20_SPLITS, "val": ["VID110"],
                                                                             "train": F.CT20_SPLITS["train"]}}})
    bad = {**TRACK20, "settings": {"a": {"scheme": "iid"},
                                   "c": {"scheme": "lmo", "base": "a", "client_classes": ["all", "laser", "cold"]}}}
    with pytest.raises(ValueError, match="'laser' is neither 'all' nor a surgical.tool_groups name"):
        _build(indices, "g", bad)
    with pytest.raises(ValueError, match="not in the index"):
        _build(indices, "g", {**TRACK20, "exclude_videos": {"cholectrack20": ["VID99"]}})


def test_deterministic_and_written(combined, indices, tmp_path):
    again = _build(indices, "combined", COMBINED)
    for name, st in combined.settings.items():
        pd.testing.assert_frame_equal(st.frames, again.settings[name].frames)
    write_group(combined, tmp_path / "combined", "synthetic")
    frames, info = read_setting(tmp_path / "combined", "c")
    pd.testing.assert_frame_equal(frames, combined.settings["c"].frames, check_dtype=False)
    assert info["clients"][1]["classes"] == [c for c in combined.classes if c in F.TOOL_GROUPS["energy"]]
    stats = pd.read_csv(tmp_path / "combined" / "c" / "stats.csv")
    row = stats[(stats["client"] == 1) & (stats["split"] == "train")].iloc[0]
    assert row["boxes_grasper"] == 0 and row["boxes_removed"] > 0
    assert stats.groupby("split")["frames"].sum().sum() == len(frames)
    assert (tmp_path / "combined" / "c" / "distribution_synthetic.png").stat().st_size > 5000
    doc = json.loads((tmp_path / "combined" / "group.json").read_text())
    assert doc["excluded"] == ["cholectrack20/VID30", "cholectrack20/VID31"]
