"""FedST data path: configured input size (area/linear images, nearest masks) and the byte-bounded clip cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fedmedbench.fl.tasks.segmentation import ClipSet, FrameCache, input_size, resize_clip


def test_resize_averages_images_and_keeps_mask_labels():
    frames = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    frames[0, :, :2, :2] = 200  # top-left 2x2 block
    frames[0, :, 0, 0] = 100
    mask = torch.tensor([[0, 3, 1, 1], [3, 3, 1, 1], [2, 2, 0, 0], [2, 2, 0, 0]], dtype=torch.uint8)
    x, m = resize_clip(frames, mask, (2, 2))
    assert x.shape == (1, 3, 2, 2) and x.dtype == torch.uint8
    assert x[0, 0, 0, 0] == 175 and x[0, 0, 1, 1] == 0  # area: (100 + 3 * 200) / 4
    assert set(m.unique().tolist()) <= {0, 1, 2, 3}  # nearest: never a blended label
    assert m.tolist() == [[3, 1], [2, 0]]  # nearest-exact: the pixel at each output centre (1, 1), (1, 3) ..
    up, mu = resize_clip(frames, mask, (8, 8))  # enlarging: bilinear, masks still nearest
    assert up.shape == (1, 3, 8, 8) and set(mu.unique().tolist()) == {0, 1, 2, 3}
    same = resize_clip(frames, mask, (4, 4))
    assert same[0] is frames and same[1] is mask
    assert input_size(None) is None and input_size([480, 480]) == (480, 480)
    with pytest.raises(ValueError, match="data.input_size"):
        input_size([480])


def test_cache_evicts_least_recently_used_by_bytes():
    cache = FrameCache(max_bytes=250)
    item = lambda: (torch.zeros(100, dtype=torch.uint8), torch.zeros(0, dtype=torch.uint8))  # noqa: E731
    cache.put("a", item())
    cache.put("b", item())
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", item())  # 300 bytes > 250: b goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.bytes == 200 <= cache.max_bytes
    cache.put("big", (torch.zeros(300, dtype=torch.uint8), torch.zeros(0)))  # larger than the bound: not kept
    assert cache.get("big") is None and len(cache) == 2
    off = FrameCache(0)
    off.put("a", item())
    assert len(off) == 0


def _clip(tmp, name, h, w, label):
    rng = np.random.default_rng(0)
    paths = []
    for t in range(2):
        p = tmp / f"{name}_{t}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    m = tmp / f"{name}_m.png"
    mask = np.zeros((h, w), np.uint8)
    mask[: h // 2] = label
    Image.fromarray(mask).save(m)
    return paths, str(m)


def test_clips_of_different_sizes_come_out_at_the_configured_size(tmp_path):
    a = _clip(tmp_path, "a", 108, 192, 1)  # 16:9 (site A) and 5:4 (site B) frames
    b = _clip(tmp_path, "b", 128, 160, 2)
    cache = FrameCache(10 * 2**20)
    cs = ClipSet([a[0], b[0]], [a[1], b[1]], "test", (32, 48), cache)
    x, y = cs.batch([0, 1])
    assert x.shape == (2, 2, 3, 32, 48) and y.shape == (2, 32, 48) and y.dtype == torch.int64
    assert y[0, :16].eq(1).all() and y[0, 16:].eq(0).all() and y[1, :16].eq(2).all()
    assert len(cache) == 2 and cache.bytes == 2 * (2 * 3 * 32 * 48 + 32 * 48)  # resized uint8 entries only
    pooled = ClipSet.concat([cs], "pooled")
    pooled.batch([0])
    assert len(cache) == 2  # shared entries, no second copy
    raw = ClipSet([a[0], b[0]], [a[1], b[1]], "raw")
    with pytest.raises(ValueError, match="data.input_size"):
        raw.batch([0, 1])


def test_a_2hz_release_gives_one_real_previous_frame():
    """docs/fedst.md, docs/surgical_data.md: at 2 Hz a 0.2 s clip is (t-0.5, t-0.5, t, t)."""
    import pandas as pd

    from fedmedbench.data.surgical.export_clips import build_clips

    index = pd.DataFrame({"dataset": "ev17", "split": "train", "video_id": "v", "frame": range(4),
                          "timestamp_s": [0.0, 0.5, 1.0, 1.5], "image_path": [f"f{i}.png" for i in range(4)],
                          "labelled": True, "mask_path": [f"m{i}.png" for i in range(4)]})
    clips = build_clips(index, num_previous=3, interval_s=0.2, tolerance_s=0.1)
    last = clips.iloc[-1]
    assert list(last["clip_paths"]) == ["f2.png", "f2.png", "f3.png", "f3.png"]
    assert int(last["n_duplicated"]) == 1


def test_synthetic_grasp_stand_in_writes_binary_masks(tmp_path):
    """Table VIII's set: the frames+masks adapter with label_set binary reads 0 / 1 masks."""
    from fedmedbench.data.surgical.synthetic_layouts import generate

    out = generate("grasp", {"layout": "frames_masks", "fps": 1, "label_set": "binary"},
                   {"style": "prostatectomy", "test_videos": 1, "test_frames": [3, 3]}, 0, 48, 32, tmp_path / "GraSP")
    values = set()
    for m in out.glob("test/*/masks/*.png"):
        values |= set(np.unique(np.asarray(Image.open(m))).tolist())
    assert values and values <= {0, 1} and 1 in values
    parts = generate("rarp", {"layout": "frames_masks", "fps": 1}, {"style": "prostatectomy", "test_videos": 1, "test_frames": [3, 3]},
                     0, 48, 32, tmp_path / "RARP")
    assert max(int(np.asarray(Image.open(m)).max()) for m in parts.glob("test/*/masks/*.png")) > 1  # parts kept
