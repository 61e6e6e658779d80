"""The segmentation task's data: a site's labelled clips (``<site>/clips.parquet`` of
``export_clips``), read as uint8 (T, 3, H, W) frames with an int64 (H, W) mask, resized to
``input_size``, kept decoded in a bounded cache (decoded ahead in threads; shared on disk with
``engine.image_cache``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedmedbench.fl.tasks.clip_store import ClipStore


class FrameCache:
    """Decoded, resized clips kept in memory, least recently used evicted first, bounded by bytes.

    One cache serves every clip set of a run (a site's test clips and the pooled test set share
    entries); ``max_bytes`` 0 disables caching (decode on every access). ``workers`` threads decode
    the clips a loop asks for ahead of use (:meth:`prefetch`; 0: each clip is decoded when it is
    used, in the caller's thread): a GPU need not wait for PNG decoding between its steps. A clip
    decodes to the same bits in any thread, so the workers change speed only. ``disk``: a folder where
    the decoded clips are also kept for every job (``engine.image_cache``; :mod:`.clip_store`)."""

    def __init__(self, max_bytes: int, workers: int = 0, disk: str | Path | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"fedst data.cache_mb must be >= 0, got {max_bytes / 2**20:g}")
        if workers < 0:
            raise ValueError(f"engine.loader_workers must be >= 0, got {workers}")
        self.max_bytes = int(max_bytes)
        self.workers = int(workers)
        self.store = ClipStore(disk) if disk else None
        self.bytes = 0
        self._items: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._pending: dict[tuple, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict[str, Any]:  # a task sent to another process takes no threads or reads in flight
        return {**self.__dict__, "_pending": {}, "_pool": None}

    def get(self, key: tuple) -> tuple[torch.Tensor, torch.Tensor] | None:
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
        return hit

    def put(self, key: tuple, value: tuple[torch.Tensor, torch.Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in value)
        if size > self.max_bytes or key in self._items:
            return
        while self.bytes + size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= sum(t.numel() * t.element_size() for t in old)
        self._items[key] = value
        self.bytes += size

    def fetch(self, key: tuple, read: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The clip under ``key``: from memory, from a decode in flight, or ``read()`` now (then kept)."""
        hit = self.get(key)
        if hit is None:
            pending = self._pending.pop(key, None)
            hit = pending.result() if pending is not None else read()  # a failed read raises here, as it would inline
            self.put(key, hit)
        return hit

    @property
    def submit(self) -> Callable[..., Future] | None:
        """The worker threads' ``submit`` (None without workers): other work of the same loop may run there too
        (the evaluation's scores, while the model predicts the next batch)."""
        if self.workers == 0:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="clip-decode")
        return self._pool.submit

    def prefetch(self, key: tuple, read: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Start decoding ``key`` in a worker thread, unless it is in memory or in flight (or there are no workers).
        Callers ask only for clips they will fetch: a decode that is never fetched is held until the cache goes."""
        submit = self.submit
        if submit is None or key in self._items or key in self._pending:
            return
        self._pending[key] = submit(read)


def resize_clip(frames: torch.Tensor, mask: torch.Tensor, size: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (T, 3, H, W) frames and (H, W) mask -> the configured (h, w).

    Images: area averaging when shrinking both sides (no aliasing of the 1920x1080 frames),
    antialiased bilinear otherwise; masks: nearest neighbour (labels are never blended)."""
    if size is None or tuple(frames.shape[-2:]) == tuple(size):
        return frames, mask
    h, w = int(size[0]), int(size[1])
    x = frames.float()
    if h <= frames.shape[-2] and w <= frames.shape[-1]:
        x = F.interpolate(x, size=(h, w), mode="area")
    else:
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    m = F.interpolate(mask[None, None].float(), size=(h, w), mode="nearest-exact")[0, 0]
    return x.round().clamp(0, 255).to(torch.uint8), m.to(mask.dtype)


def _fits(kept: tuple[np.ndarray, np.ndarray, np.ndarray], frames: int, distinct: int) -> bool:
    """A stored entry is this clip's decode: its distinct images and their order in the clip match (otherwise it is
    damaged, and the clip is decoded and written again)."""
    images, order, _ = kept
    return len(images) == distinct and order.shape == (frames,) and bool(((order >= 0) & (order < distinct)).all())


@dataclass
class ClipSet:
    """Clips of one site and split, decoded on demand, resized to ``size`` (None = as stored;
    then every clip of a batch must have the same size), kept in a shared :class:`FrameCache`."""

    clip_paths: list[list[str]]
    mask_paths: list[str]
    source: str  # for error messages
    size: tuple[int, int] | None = None
    cache: FrameCache | None = None

    def __post_init__(self) -> None:
        if self.cache is None:
            self.cache = FrameCache(0)

    def __len__(self) -> int:
        return len(self.mask_paths)

    @staticmethod
    def concat(sets: list[ClipSet], source: str) -> ClipSet:
        size = sets[0].size if sets else None
        cache = sets[0].cache if sets else None
        return ClipSet([p for s in sets for p in s.clip_paths], [m for s in sets for m in s.mask_paths], source, size, cache)

    def _key(self, i: int) -> tuple:
        return (tuple(self.clip_paths[i]), self.mask_paths[i], self.size)

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, 3, h, w) uint8 frames and (h, w) int64 mask of clip ``i``."""
        frames, mask, *order = self.cache.fetch(self._key(i), partial(self._read, i))
        return (frames[order[0]] if order else frames), mask.long()

    def prefetch(self, idx: Iterable[int]) -> None:
        """Decode clips ``idx`` in the cache's worker threads ahead of their use (no-op without workers)."""
        for i in idx:
            self.cache.prefetch(self._key(int(i)), partial(self._read, int(i)))

    def _read(self, i: int) -> tuple[torch.Tensor, ...]:
        """Decodes each distinct frame file of the clip once: a clip whose frames repeat (no frame at the clip
        interval, e.g. EndoVis at 2 Hz: t-0.5, t-0.5, t, t) decodes and resizes 2 images, not 4; each image is
        resized on its own, so a repeat is the same bits as decoding its file again. Returns (frames, mask), or
        (distinct frames, mask, their order in the clip) where frames repeat: the cache holds each image once
        and :meth:`item` repeats it."""
        from PIL import Image

        paths = self.clip_paths[i]
        distinct = list(dict.fromkeys(paths))
        order = [distinct.index(p) for p in paths]
        store = self.cache.store
        entry = store.path([*paths, self.mask_paths[i]], self.size) if store is not None else None  # repeats in order
        kept = store.load(entry) if entry is not None else None
        if kept is not None and _fits(kept, len(paths), len(distinct)):  # what the decode below made of it
            frames, kept_order, mask = kept
            x, m = torch.from_numpy(frames), torch.from_numpy(mask)
            return (x, m, torch.from_numpy(kept_order)) if len(distinct) < len(paths) else (x, m)
        try:
            images = [np.asarray(Image.open(p).convert("RGB")) for p in distinct]
            mask = np.asarray(Image.open(self.mask_paths[i]))
        except Exception as exc:  # noqa: BLE001 - any decoder's failure (an image plugin's too) names the clip
            raise RuntimeError(f"{self.source}: clip {i}: cannot read an image ({exc})") from exc
        try:
            frames = np.stack(images)
        except ValueError as exc:  # frames of different sizes within one clip
            raise ValueError(f"{self.source}: clip {i}: frames {self.clip_paths[i]} differ in size ({exc})") from exc
        if mask.shape != frames.shape[1:3]:
            raise ValueError(f"{self.mask_paths[i]}: mask {mask.shape} does not match its frames {frames.shape[1:3]} ({self.source})")
        if mask.max(initial=0) > 255:
            raise ValueError(f"{self.mask_paths[i]}: label {int(mask.max())} does not fit the uint8 mask cache")
        x = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
        x, m = resize_clip(x, torch.from_numpy(mask.astype(np.uint8)), self.size)
        if entry is not None:
            store.save(entry, x.numpy(), np.asarray(order, dtype=np.int64), m.numpy())
        return (x, m, torch.tensor(order, dtype=torch.int64)) if len(distinct) < len(paths) else (x, m)

    def batch(self, idx: list[int] | np.ndarray, ahead: Iterable[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Clips ``idx`` stacked; with workers their decodes run in parallel, then those of ``ahead`` (the clips
        the next batches will certainly take) start while the caller works on this one."""
        idx = [int(i) for i in idx]
        self.prefetch(idx)
        self.prefetch(ahead)
        items = [self.item(i) for i in idx]
        shapes = {tuple(x.shape) for x, _ in items}
        if len(shapes) > 1:
            raise ValueError(f"{self.source}: clips of different sizes {sorted(shapes)} in one batch; "
                             "set fedst data.input_size")
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    def batches(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every clip in order, ``size`` at a time (the next batch decoding while this one is used)."""
        for start in range(0, len(self), size):
            yield self.batch(range(start, min(len(self), start + size)),
                             ahead=range(start + size, min(len(self), start + 2 * size)))


@dataclass
class SiteData:
    """What ``ctx.data`` holds on a client of the segmentation task."""

    site: str
    index: int  # position among all sites of sites.json (one-hot indicator)
    prompt: str
    train: ClipSet
    test: ClipSet
    indicator: torch.Tensor
    loss: dict[str, Any]  # task_params.loss: dice_weight, augment, rotate_deg, scale
    local_steps: int | None = None  # exact iterations per round (task_params.local_steps), else the engine's

    @property
    def num_train(self) -> int:
        return len(self.train)


def load_sites(clips_root: str | Path) -> dict[str, Any]:
    path = Path(clips_root) / "sites.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: clip export not found (task_params.clips_root; run export_clips)")
    return json.loads(path.read_text())


def input_size(value: Any) -> tuple[int, int] | None:
    """``fedst data.input_size``: [h, w] the clips are resized to, or None (as stored)."""
    if value is None:
        return None
    if not (isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
        raise ValueError(f"fedst data.input_size must be [height, width] in pixels or null, got {value!r}")
    return int(value[0]), int(value[1])


def load_clipset(clips_root: str | Path, site: str, split: str | None, num_frames: int,
                 size: tuple[int, int] | list[int] | None = None, cache: FrameCache | None = None) -> ClipSet:
    """Clips of ``site`` (``split`` None = all splits), each with exactly ``num_frames`` frames,
    resized to ``size`` (h, w) when given."""
    import pandas as pd

    path = Path(clips_root) / site / "clips.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no clips for site '{site}' (fedst sites / surgical.sites)")
    df = pd.read_parquet(path)
    if split is not None:
        df = df[df["split"] == split]
    df = df.sort_values(["video_id", "frame"])
    clips = [list(p) for p in df["clip_paths"]]
    bad = [len(c) for c in clips if len(c) != num_frames]
    if bad:
        raise ValueError(f"{path}: clips have {bad[0]} frames, the model is configured for {num_frames} "
                         "(fedst model.pools / surgical.clips.num_previous + 1)")
    return ClipSet(clips, list(df["mask_path"]), f"{path} [{split or 'all'}]",
                   tuple(int(v) for v in size) if size else None, cache)
