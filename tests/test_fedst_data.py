"""FedST data path: configured input size (area/linear images, nearest masks) and the byte-bounded clip cache."""

from __future__ import annotations

from pathlib import Path

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


def _handmade_site(root: Path, n: int) -> None:
    """One training video of frames 000000 .. n-1 in the generic layout; only the last has a mask."""
    video = root / "Site" / "train" / "v1"
    (video / "frames").mkdir(parents=True)
    (video / "masks").mkdir()
    for k in range(n):
        Image.fromarray(np.full((8, 8, 3), k, np.uint8)).save(video / "frames" / f"{k:06d}.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(video / "masks" / f"{n - 1:06d}.png")


@pytest.mark.parametrize(("option", "clip_frames", "repeated"), [
    ({"release": "handmade_30fps"}, [12, 18, 24, 30], 0),   # t = 1 s: the frames at 0.4, 0.6, 0.8 s
    ({"release": "handmade_1fps"}, [30, 30, 30, 30], 3),    # t = 30 s: frame 29 is 1 s back, no frame near 29.4-29.8 s
    ({"release": "handmade_1fps", "fps": 30}, [12, 18, 24, 30], 0),  # a configured fps wins over the listed one
])
def test_clip_history_is_timed_by_the_sites_listed_frame_rate(tmp_path, monkeypatch, option, clip_frames, repeated):
    """The same 31 files, numbered one after another, read as a release listed at 30 fps or at 1 fps
    (``facts.FRAME_RATES``): the 0.2 s history slots take the frames 0.6, 0.4, 0.2 s back at 30 fps and
    repeat the current frame at 1 fps."""
    import pandas as pd

    from fedmedbench.data.surgical import facts
    from fedmedbench.data.surgical.export_clips import build_clips
    from fedmedbench.data.surgical.index import build_index

    monkeypatch.setitem(facts.FRAME_RATES, "handmade_30fps", facts.FrameRate(30.0, "unverified", "test"))
    monkeypatch.setitem(facts.FRAME_RATES, "handmade_1fps", facts.FrameRate(1.0, "release documentation", "test"))
    _handmade_site(tmp_path / "raw", 31)
    meta = build_index("site", {"layout": "frames_masks", "folder": "Site", **option}, tmp_path / "raw",
                       tmp_path / "index", log=lambda m: None)
    index = pd.read_parquet(tmp_path / "index" / "index.parquet")
    clips = build_clips(index, num_previous=3, interval_s=0.2, tolerance_s=0.1)
    assert len(clips) == 1 and meta["fps"] == (30.0 if clip_frames[0] == 12 else 1.0)
    assert [int(Path(p).stem) for p in clips.iloc[0]["clip_paths"]] == clip_frames
    assert int(clips.iloc[0]["n_duplicated"]) == repeated


def test_an_unlisted_release_is_refused_naming_the_key(tmp_path):
    from fedmedbench.data.surgical.index import build_index

    _handmade_site(tmp_path / "raw", 2)
    with pytest.raises(ValueError, match=r"surgical\.datasets\.site\.release = 'nope' is not a listed release"):
        build_index("site", {"layout": "frames_masks", "folder": "Site", "release": "nope"}, tmp_path / "raw",
                    tmp_path / "index", log=lambda m: None)


def test_history_at_each_rate_is_real_repeated_or_both():
    """A regular sequence at 30 fps gives the slots 0.6, 0.4, 0.2 s back; at 2 Hz the frame 0.5 s back twice and
    the current frame once; at 1 fps (and slower) only repeats."""
    from fedmedbench.data.surgical.export_clips import history_offsets, history_text

    assert history_offsets(30.0) == pytest.approx([-0.6, -0.4, -0.2])
    assert history_offsets(2.0) == [-0.5, -0.5, 0.0] and history_offsets(1.0) == [0.0, 0.0, 0.0]
    assert history_offsets(60.0) == pytest.approx([-0.6, -0.4, -0.2])
    assert history_text(history_offsets(30.0)) == "real earlier frames (-0.6, -0.4, -0.2 s)"
    assert history_text([-0.5, -0.5, 0.0]) == "real earlier frames (-0.5, -0.5 s), 1 slot repeated"
    assert history_text([0.0, 0.0, 0.0]) == "repeated"


def test_the_paper_grids_sites_take_their_listed_frame_rates_and_the_doc_states_each():
    """config/studies/fedst.yaml names each site's release; the rate comes from the one list (GraSP: the
    GraSP_30fps frames at 30 fps, documented; Hyst-YT 1 fps and Lob-YT 30 fps unverified); docs/fedst.md has a
    row per site with its release key, rate, basis and what its clip history holds; the schema's release
    names are the list's."""
    import yaml

    from fedmedbench.data.surgical.endovis2017 import OFFICIAL_FPS as EV17
    from fedmedbench.data.surgical.endovis2018 import OFFICIAL_FPS as EV18
    from fedmedbench.data.surgical.export_clips import history_offsets, history_text
    from fedmedbench.data.surgical.facts import FRAME_RATES, TABLE_I, release_key

    root = Path(__file__).resolve().parents[1]
    surgical = yaml.safe_load((root / "config" / "studies" / "fedst.yaml").read_text())["surgical"]
    key = {}
    for site, cfg in surgical["sites"].items():
        ds = surgical["datasets"][cfg["dataset"]]
        assert ds.get("fps") is None, f"{site}: the rate belongs in facts.FRAME_RATES"
        key[site] = release_key(ds)
    rate = {s: FRAME_RATES[k] for s, k in key.items()}
    assert {s: r.fps for s, r in rate.items()} == {"A": 2.0, "B": 2.0, "C": 30.0, "D": 1.0, "E": 30.0, "sim": 1.0, "G": 30.0}
    assert {s for s, r in rate.items() if r.basis == "release documentation"} == {"A", "C", "G"}
    assert {r.basis for r in rate.values()} == {"release documentation", "unverified"}
    assert "GraSP_30fps" in rate["G"].folder and "30fps" in rate["G"].source and "1,973" in rate["D"].source
    assert EV17 == EV18 == 2.0
    assert set(TABLE_I) <= set(FRAME_RATES)
    schema = yaml.safe_load((root / "config" / "schema.yaml").read_text())
    assert schema["definitions"]["surgical_dataset"]["properties"]["release"]["enum"] == [*FRAME_RATES, None]
    lines = (root / "docs" / "fedst.md").read_text().splitlines()
    for site, r in rate.items():
        history = history_text(history_offsets(r.fps))
        row = [line for line in lines if line.startswith(f"| {site} |") and f"`{key[site]}`" in line]
        assert len(row) == 1, site
        assert f"| {r.fps:g} |" in row[0] and r.basis in row[0] and history in row[0], (site, row[0])


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


def _frames_on_disk(tmp, names, h=40, w=56):
    """PNG frames with random content under ``names`` (same name = same file), and a mask."""
    rng = np.random.default_rng(1)
    for name in dict.fromkeys(names):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp / name)
    mask = tmp / "mask.png"
    Image.fromarray((rng.integers(0, 4, (h, w))).astype(np.uint8)).save(mask)
    return [str(tmp / n) for n in names], str(mask)


@pytest.mark.parametrize("size", [(20, 28), (64, 80)])  # shrinking (area) and enlarging (antialiased bilinear)
def test_a_clip_decodes_each_distinct_frame_once_and_gives_the_bits_of_decoding_all(tmp_path, monkeypatch, size):
    """A clip whose earlier frames repeat (no frame at the clip interval: EndoVis at 1-2 fps) decodes and
    resizes each distinct file once; the tensor is the one of a clip with every frame in its own file."""
    import shutil

    repeated, mask = _frames_on_disk(tmp_path, ["f2.png", "f2.png", "f3.png", "f3.png"])
    copies = [str(tmp_path / n) for n in ("f2.png", "f2b.png", "f3.png", "f3b.png")]
    shutil.copy(tmp_path / "f2.png", copies[1])
    shutil.copy(tmp_path / "f3.png", copies[3])
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    cache = FrameCache(10 * 2**20)
    x, y = ClipSet([repeated], [mask], "repeated", size, cache).item(0)
    assert sorted(opened) == sorted([repeated[0], repeated[2], mask])  # 2 frames and the mask, not 4 frames
    opened.clear()
    copies_cache = FrameCache(10 * 2**20)
    x_all, y_all = ClipSet([copies], [mask], "copies", size, copies_cache).item(0)
    assert len(opened) == 5
    assert x.shape == (4, 3, *size) and torch.equal(x, x_all) and torch.equal(y, y_all)
    assert torch.equal(x[0], x[1]) and not torch.equal(x[1], x[2])
    # the cache holds each distinct image once (and their order in the clip), and gives the same bits again
    frame, plane = 3 * size[0] * size[1], size[0] * size[1]
    assert copies_cache.bytes == 4 * frame + plane and cache.bytes == 2 * frame + plane + 4 * 8
    opened.clear()
    x_again, y_again = ClipSet([repeated], [mask], "repeated", size, cache).item(0)
    assert not opened and torch.equal(x_again, x) and torch.equal(y_again, y)


def test_decode_workers_read_the_next_clips_ahead_and_change_no_bit(tmp_path, monkeypatch):
    import threading

    clips = []
    for c in range(5):
        d = tmp_path / f"c{c}"
        d.mkdir()
        clips.append(_frames_on_disk(d, [f"{t}.png" for t in range(3)]))
    paths, masks = [c[0] for c in clips], [c[1] for c in clips]
    where: dict[int, str] = {}
    real_read = ClipSet._read
    monkeypatch.setattr(ClipSet, "_read", lambda self, i: where.setdefault(i, threading.current_thread().name)
                        and real_read(self, i))
    inline = ClipSet(paths, masks, "inline", (16, 24), FrameCache(0))
    ahead = ClipSet(paths, masks, "ahead", (16, 24), FrameCache(0, workers=2))
    x, y = ahead.batch([0, 1], ahead=[2, 3])
    assert set(ahead.cache._pending) == {ahead._key(2), ahead._key(3)}  # decoding while batch 0-1 is used
    assert torch.equal(x, inline.batch([0, 1])[0]) and torch.equal(y, inline.batch([0, 1])[1])
    x, y = ahead.batch([2, 3])
    assert not ahead.cache._pending  # each clip read ahead was taken
    assert torch.equal(x, inline.batch([2, 3])[0])
    assert all(where[i].startswith("clip-decode") for i in (0, 1, 2, 3))
    where.clear()
    inline.batch([4])
    assert where[4] == threading.current_thread().name  # without workers: in the caller's thread
    # a damaged file read ahead fails where the clip is used, naming it
    Path(paths[4][1]).write_bytes(b"not a png")
    bad = ClipSet(paths, masks, "site X train", (16, 24), FrameCache(0, workers=2))
    bad.prefetch([4])
    with pytest.raises(RuntimeError, match="site X train: clip 4: cannot read an image"):
        bad.batch([4])
    with pytest.raises(ValueError, match="loader_workers"):
        FrameCache(0, workers=-1)


class _LastFrame(torch.nn.Module):
    """Four-class logits from the current frame (a 1x1 convolution)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x, temporal=True):
        return self.conv(x[:, -1].float() / 255)


def test_local_training_gives_the_same_weights_and_loss_with_decode_workers(tmp_path, monkeypatch):
    """train_steps with clips decoded ahead in 3 threads = decoded on demand, bit for bit; every clip read
    ahead is used; the mean loss is the float64 sum of the step losses, as a Python float sum gives."""
    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.tasks.segmentation import training as seg

    clips = []
    for c in range(7):
        d = tmp_path / f"c{c}"
        d.mkdir()
        clips.append(_frames_on_disk(d, ["a.png", "a.png", "b.png"], h=24, w=32))
    losses = []
    real_loss = seg.seg_loss
    monkeypatch.setattr(seg, "seg_loss", lambda *a: losses.append(real := real_loss(*a)) or real)
    train = TrainConfig(rounds=1, local_epochs=1, batch_size=2, lr=0.1, optimizer="adamw")
    runs = []
    for workers in (0, 3):
        data = ClipSet([c[0] for c in clips], [c[1] for c in clips], "site", (12, 16), FrameCache(0, workers))
        model = _LastFrame()
        losses.clear()
        mean = seg.train_steps(model, data, 9, train, 0.1, torch.device("cpu"), torch.Generator().manual_seed(4),
                               {"augment": True, "rotate_deg": 15, "scale": 0.1})
        assert not data.cache._pending  # 9 steps over 7 clips: reshuffles included, nothing read in vain
        step_sum = 0.0
        for loss in losses:
            step_sum += float(loss)
        assert mean == step_sum / 9
        runs.append((mean, {k: v.clone() for k, v in model.state_dict().items()}))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_clips_kept_on_disk_give_the_decoded_bits_to_every_later_cache_without_decoding(tmp_path, monkeypatch):
    """engine.image_cache: a clip's entry holds what decoding made of it; a fresh cache (another job) reads it with
    no image opened; a damaged entry is decoded and written again; a replaced frame gets its own entry."""
    clips = []
    for c, names in enumerate((["a.png", "a.png", "b.png"], ["a.png", "b.png", "c.png"])):  # repeats (2 Hz), none
        (tmp_path / f"c{c}").mkdir()
        clips.append(_frames_on_disk(tmp_path / f"c{c}", names, h=24, w=32))
    frames0, mask0 = clips[0]
    clips.append(([frames0[0], frames0[2], frames0[2]], mask0))  # the same files and mask, repeated otherwise

    def clipset(disk=None):
        return ClipSet([c[0] for c in clips], [c[1] for c in clips], "site", (12, 16), FrameCache(0, disk=disk))

    def same(a, b):
        return all(torch.equal(x, y) and x.dtype == y.dtype for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))

    want = [clipset().item(i) for i in range(3)]
    assert not torch.equal(want[0][0], want[2][0])
    store = tmp_path / "store"
    assert same([clipset(store).item(i) for i in range(3)], want)
    entries = sorted(store.rglob("*.npz"))
    assert len(entries) == 3 and len([p for p in store.rglob("*") if p.is_file()]) == 3  # no temporary file left
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert same([clipset(store).item(i) for i in range(3)], want) and opened == []
    entries[0].write_bytes(b"not an npz")
    assert same([clipset(store).item(i) for i in range(3)], want) and opened  # decoded again
    assert all(np.load(e)["frames"].dtype == np.uint8 for e in entries)  # and written again
    for i, entry in enumerate(entries):  # a readable entry whose order does not fit its images is damaged too
        with np.load(entry) as z:
            kept = {k: z[k] for k in z.files}
        with open(entry, "wb") as fh:
            np.savez(fh, **{**kept, "order": kept["order"][:2] if i % 2 else kept["order"] + 5})
    opened.clear()
    assert same([clipset(store).item(i) for i in range(3)], want) and opened  # decoded again
    monkeypatch.undo()
    Image.fromarray(np.zeros((24, 32, 3), np.uint8)).save(clips[1][0][2])  # c.png replaced
    assert int(clipset(store).item(1)[0][2].max()) == 0 and len(list(store.rglob("*.npz"))) == 4
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError, match=r"engine.image_cache: cannot make the folder .*a-file"):
        clipset(tmp_path / "a-file")
