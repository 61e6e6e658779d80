"""The ``segmentation`` task: surgical clips per site (``export_clips``), part segmentation.

Data: ``task_params.clips_root`` holds ``sites.json`` and ``<site>/clips.parquet`` (one row
per labelled frame: ``clip_paths`` oldest .. current, ``mask_path``, ``split``). Clients
are ``task_params.sites`` in order (partition id = position). A clip is loaded as uint8
(T, 3, H, W) with exactly the frames ``clip_paths`` lists (T = num_previous + 1), its mask
as int64 (H, W).

Evaluation (metrics from :mod:`fedmedbench.segmetrics`): ``local_*`` = a model on one
site's test clips; ``global_*`` = on the test clips of all federated sites together.
Metric names: ``dice``, ``iou``, ``hd95``, ``assd`` (means over the part classes) and
``<metric>_<class>`` per class. Out-of-federation and unseen-binary evaluation of the
deployed model are done after training (``scripts/fedst_train.py``).

Also here: the local training loop every method of the study uses (CE + lambda1 Dice,
Eq. 9; AdamW or Adam; rotation/scale augmentation) and the per-site indicators of the
channel selection (CLIP text embeddings from a local weights file, or the paper's
one-hot / Gaussian / random alternatives of Table VII).
"""

from __future__ import annotations

import json
import math
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

from fedmedbench.fl.registry import TrainConfig
from fedmedbench.fl.tasks.base import Task, register_task
from fedmedbench.fl.tasks.clip_store import ClipStore
from fedmedbench.fl.training import on_device
from fedmedbench.segmetrics import METRICS, RESOLUTIONS, SegmentationMeter, native_masks, native_spacing

INDICATORS = ("clip", "onehot", "gaussian", "random")


# ----------------------------------------------------------------------------- data


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


# ----------------------------------------------------------------------------- indicators


def site_indicators(sites: dict[str, dict], cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One fixed indicator vector per site (all sites of sites.json, in their order)."""
    kind, dim = cfg.get("kind", "onehot"), int(cfg.get("dim", 512))
    names = list(sites)
    if kind not in INDICATORS:
        raise ValueError(f"fedst indicator.kind = {kind!r}: choose one of {list(INDICATORS)}")
    if kind == "clip":
        return _clip_indicators(sites, cfg, dim)
    if dim < len(names):
        raise ValueError(f"fedst indicator.dim = {dim} is smaller than the number of sites ({len(names)})")
    out = {}
    for i, name in enumerate(names):
        g = torch.Generator().manual_seed(1000 + i)
        onehot = F.one_hot(torch.tensor(i), dim).float()
        if kind == "onehot":
            out[name] = onehot
        elif kind == "gaussian":  # Table VII: exp(-(x - mu)^2 / (2 sigma^2)) over dimensions x, mu = the site's id
            x = torch.arange(dim, dtype=torch.float32)
            sigma = float(cfg.get("sigma", 0.1))
            out[name] = torch.exp(-((x - i) ** 2) / (2 * sigma**2))
        else:  # random: no relation to the site identity
            out[name] = torch.randn(dim, generator=g)
    return out


def _clip_indicators(sites: dict[str, dict], cfg: dict[str, Any], dim: int) -> dict[str, torch.Tensor]:
    """Frozen CLIP text embeddings of each site's prompt (L2-normalised), from a local file."""
    weights = cfg.get("clip_weights")
    if not weights:
        raise ValueError("fedst indicator.kind = clip needs indicator.clip_weights: an open_clip weight set "
                         "(docs/weights.md; e.g. clip_vit_b32_laion2b); or choose onehot, gaussian or random (Table VII)")
    path = Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: CLIP weights file not found (fedst indicator.clip_weights)")
    import open_clip

    from fedmedbench.weights.models import load_open_clip, read_open_clip

    state = read_open_clip(path)  # weights_only / safetensors: refused before any model is built
    model = open_clip.create_model(cfg.get("clip_model", "ViT-B-32"), pretrained=None)
    load_open_clip(model, path, state)  # every tensor must fit
    model.eval()
    tokenizer = open_clip.get_tokenizer(cfg.get("clip_model", "ViT-B-32"))
    names = list(sites)
    with torch.no_grad():
        emb = F.normalize(model.encode_text(tokenizer([sites[n]["prompt"] for n in names])).float(), dim=-1)
    if emb.shape[1] != dim:
        raise ValueError(f"fedst indicator.dim = {dim} but the CLIP text embedding has {emb.shape[1]} dimensions")
    return {n: emb[i].clone() for i, n in enumerate(names)}


# ----------------------------------------------------------------------------- training


def dice_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Soft multi-class Dice loss (mean over classes present in the batch or predicted)."""
    prob = logits.softmax(dim=1)
    onehot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).float()
    inter = (prob * onehot).sum(dim=(0, 2, 3))
    denom = prob.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
    return 1.0 - ((2 * inter + 1e-5) / (denom + 1e-5)).mean()


def seg_loss(logits: torch.Tensor, target: torch.Tensor, dice_weight: float) -> torch.Tensor:
    """Eq. 9: L_CE + lambda1 * L_Dice."""
    return F.cross_entropy(logits, target) + dice_weight * dice_loss(logits, target)


def augment(x: torch.Tensor, y: torch.Tensor, g: torch.Generator, degrees: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rotation and scale (the paper's augmentation), the same for every frame of a clip."""
    return rotate_scale(x, y, *draw_rotate_scale(x.shape[0], g, degrees, scale))


def draw_rotate_scale(b: int, g: torch.Generator, degrees: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`augment`'s draws for a batch of ``b`` clips (angles, then scales; on the CPU generator wherever the
    clips are): a loop may draw them before it has the batch."""
    ang = (torch.rand(b, generator=g) * 2 - 1) * math.radians(degrees)
    sc = 1 + (torch.rand(b, generator=g) * 2 - 1) * scale
    return ang, sc


def rotate_scale(x: torch.Tensor, y: torch.Tensor, ang: torch.Tensor, sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Clips (B, T, C, H, W) and masks (B, H, W) rotated by ``ang`` and scaled by ``sc`` (one each a clip)."""
    b, t, c, h, w = x.shape
    cos, sin = torch.cos(ang) / sc, torch.sin(ang) / sc
    theta = torch.stack([torch.stack([cos, -sin, torch.zeros(b)], 1), torch.stack([sin, cos, torch.zeros(b)], 1)], 1)
    grid = F.affine_grid(on_device(theta, x.device), [b, c, h, w], align_corners=False)
    xf = x.float().reshape(b, t * c, h, w)
    xa = F.grid_sample(xf, grid, mode="bilinear", align_corners=False).reshape(b, t, c, h, w)
    ya = F.grid_sample(y[:, None].float(), grid, mode="nearest", align_corners=False)[:, 0].long()
    return xa.round().clamp(0, 255).to(torch.uint8), ya


def make_optimizer(params: list[torch.nn.Parameter], train: TrainConfig, lr: float) -> torch.optim.Optimizer:
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=train.weight_decay)
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)
    raise ValueError(f"fedst train.optimizer = {train.optimizer!r}: choose adamw, adam or sgd")


def train_steps(
    model: torch.nn.Module,
    data: ClipSet,
    steps: int,
    train: TrainConfig,
    lr: float,
    device: torch.device,
    generator: torch.Generator,
    loss_cfg: dict[str, Any],
    params: list[torch.nn.Parameter] | None = None,
    extra_loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    temporal: bool = True,
) -> float:
    """``steps`` optimisation steps on random batches of ``data``; returns the mean loss.

    ``params``: what is trained (default: every parameter); ``extra_loss(model, x, y,
    logits)`` adds a method's regulariser (FedLD's margin control, ...); ``temporal=False``
    bypasses the temporal module (still synthetic frames).
    """
    if len(data) == 0:
        raise ValueError(f"{data.source}: no training clips")
    model.train()
    params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    opt = make_optimizer(params, train, lr)
    bs = min(train.batch_size, len(data))
    ahead = max(bs, data.cache.workers)  # clips decoding ahead, of the steps still to come
    order: list[int] = []
    total = torch.zeros((), dtype=torch.float64, device=device)  # read once at the end: no host sync per step
    for step in range(steps):
        if len(order) < bs:
            order += torch.randperm(len(data), generator=generator).tolist()
        idx, order = order[:bs], order[bs:]
        x, y = data.batch(idx, ahead=order[:min(ahead, bs * (steps - step - 1))])
        x, y = on_device(x, device), on_device(y, device)  # augmented where the model runs; copied without waiting
        if loss_cfg.get("augment", True):
            x, y = augment(x, y, generator, float(loss_cfg.get("rotate_deg", 15)), float(loss_cfg.get("scale", 0.1)))
        logits = model(x) if temporal else model(x, temporal=False)
        loss = seg_loss(logits, y, float(loss_cfg.get("dice_weight", 0.3)))
        if extra_loss is not None:
            loss = loss + extra_loss(model, x, y, logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
        opt.step()
        total += loss.detach()  # float64, as the Python float sum it replaces: the same mean
    return float(total) / max(1, steps)


@torch.no_grad()
def evaluate_clips(model: torch.nn.Module, data: ClipSet, classes: dict[int, str], device: torch.device,
                   batch_size: int, binary: bool = False, class_rule: str = "all_classes", assd: str = "medpy_0_5",
                   resolution: str = "input") -> dict[str, float]:
    """Metrics of ``model`` on ``data`` (names: ``dice`` .. and ``dice_<class>`` ..); ``class_rule``, ``assd``:
    :mod:`fedmedbench.segmetrics`; ``resolution`` (:data:`fedmedbench.segmetrics.RESOLUTIONS`): every metric on
    the masks at the input size (``input``); the same with HD95/ASSD in each native frame's pixels
    (``native_units``); or each prediction upsampled (bilinear logits) to its mask file's size and scored
    against that file (``native``)."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"fedst eval.resolution must be one of {list(RESOLUTIONS)}, got {resolution!r}")
    model.eval()
    meter = SegmentationMeter(classes, binary=binary, class_rule=class_rule, submit=data.cache.submit,
                              max_pending=max(batch_size, 4 * data.cache.workers), assd=assd)
    start = 0
    for x, y in data.batches(batch_size):
        logits = model(x.to(device))
        files = data.mask_paths[start:start + len(y)]
        start += len(y)
        if resolution == "native":
            for one, gt in zip(logits, native_masks(files), strict=True):
                up = F.interpolate(one[None], size=gt.shape, mode="bilinear", align_corners=False)
                meter.add(up.argmax(dim=1)[0].cpu().numpy(), gt)
            continue
        pred = logits.argmax(dim=1).cpu().numpy()
        meter.add(pred, y.numpy(), native_spacing(files, tuple(y.shape[-2:])) if resolution == "native_units" else None)
    return {k.removeprefix("mean_"): v for k, v in meter.result().items()}


def metric_names(classes: dict[int, str]) -> tuple[str, ...]:
    return tuple(METRICS) + tuple(f"{m}_{c}" for m in METRICS for c in classes.values())


# ----------------------------------------------------------------------------- task


@register_task("segmentation")
class SegmentationTask(Task):
    """Sites = clients; see the module docstring. ``task_params`` keys:

    ``clips_root``, ``sites`` (federated, in client order), ``model`` (FedSTNet config),
    ``indicator`` (kind, dim, clip_weights, clip_model, sigma), ``loss`` (dice_weight,
    augment, rotate_deg, scale), ``input_size`` ([h, w] every clip is resized to; metrics,
    HD95 and ASSD included, are computed at that size), ``cache_mb`` (bound of the decoded-clip
    cache; ``spec.loader_workers`` threads decode the clips ahead of their use), ``local_steps``
    (exact iterations per round on every site and for the pooled Upperbound; None = the engine's
    epochs-based count), ``cross_site_eval`` (personalised models also on the pooled test set; off =
    ``global_*`` NaN for them), ``eval_batch_size``.
    """

    primary_metric = "dice"

    def __init__(self, spec) -> None:
        super().__init__(spec)
        tp = spec.task_params
        for key in ("clips_root", "sites", "model"):
            if key not in tp:
                raise KeyError(f"segmentation task needs task_params.{key}")
        self.meta = load_sites(tp["clips_root"])
        self.all_sites = self.meta["sites"]
        for s in tp["sites"]:
            if s not in self.all_sites:
                raise KeyError(f"fedst sites: '{s}' is not in {Path(tp['clips_root']) / 'sites.json'} ({sorted(self.all_sites)})")
        first = self.all_sites[tp["sites"][0]]
        self.classes = {i: c for i, c in enumerate(first["classes"]) if i > 0}
        self.metric_names = metric_names(self.classes)
        self.num_frames = len(tp["model"].get("pools", [7, 4, 2, 1]))
        self.indicators = site_indicators(self.all_sites, tp.get("indicator", {}))
        self.size = input_size(tp.get("input_size"))
        self.cache = FrameCache(int(tp.get("cache_mb", 2048)) * 2**20, int(spec.loader_workers), spec.image_cache)
        self._sites: dict[str, SiteData] = {}

    @property
    def num_clients(self) -> int:
        return len(self.spec.task_params["sites"])

    def site(self, name: str) -> SiteData:
        """A site's data (any site of sites.json: federated, out-of-federation or server)."""
        if name not in self._sites:
            root = self.spec.task_params["clips_root"]
            info = self.all_sites[name]
            test_split = None if info.get("role") == "out_of_federation" else "test"
            train = self._real_train(name) if test_split else ClipSet([], [], name, self.size, self.cache)
            if test_split and self.spec.task_params.get("synthetic_mix"):
                train = ClipSet.concat([train, self._synthetic()], f"{train.source} + synthetic")
            self._sites[name] = SiteData(
                site=name, index=list(self.all_sites).index(name), prompt=info["prompt"],
                train=train,
                test=load_clipset(root, name, test_split, self.num_frames, self.size, self.cache), indicator=self.indicators[name],
                loss=dict(self.spec.task_params.get("loss", {})), local_steps=self._local_steps(),
            )
        return self._sites[name]

    def _real_train(self, name: str) -> ClipSet:
        return load_clipset(self.spec.task_params["clips_root"], name, "train", self.num_frames, self.size, self.cache)

    def _synthetic(self) -> ClipSet:
        """``task_params.synthetic_mix``: every clip of that (simulator) site, mixed into each
        site's training set (FedST Fig. 7: "all synthetic samples are fully mixed")."""
        return load_clipset(self.spec.task_params["clips_root"], self.spec.task_params["synthetic_mix"], None,
                            self.num_frames, self.size, self.cache)

    def _local_steps(self) -> int | None:
        v = self.spec.task_params.get("local_steps")
        return None if v is None else int(v)

    def client_sizes(self) -> list[int]:
        return [self.site(s).num_train for s in self.spec.task_params["sites"]]

    def client_data(self, pid: int) -> SiteData:
        return self.site(self.spec.task_params["sites"][pid])

    def pooled_data(self) -> SiteData:
        sites = [self.site(s) for s in self.spec.task_params["sites"]]
        mean_ind = torch.stack([s.indicator for s in sites]).mean(0)
        train = [self._real_train(s.site) for s in sites]  # the synthetic clips once, not once per site
        if self.spec.task_params.get("synthetic_mix"):
            train.append(self._synthetic())
        return SiteData("pooled", -1, "", ClipSet.concat(train, "pooled train"),
                        self.pooled_test(), mean_ind, dict(self.spec.task_params.get("loss", {})), self._local_steps())

    def pooled_test(self) -> ClipSet:
        return ClipSet.concat([self.site(s).test for s in self.spec.task_params["sites"]], "pooled test")

    def _bs(self) -> int:
        return int(self.spec.task_params.get("eval_batch_size", 8))

    @property
    def class_rule(self) -> str:
        return str(self.spec.task_params.get("class_rule", "all_classes"))

    @property
    def scoring(self) -> dict[str, str]:
        """How :func:`evaluate_clips` scores: class rule, ASSD definition, distance unit."""
        tp = self.spec.task_params
        return {"class_rule": self.class_rule, "assd": str(tp.get("assd", "medpy_0_5")),
                "resolution": str(tp.get("resolution", "input"))}

    def evaluate_global(self, model, device):
        per_client = []
        for s in self.spec.task_params["sites"]:
            model.set_indicator(self.site(s).indicator)
            per_client.append({f"local_{k}": v for k, v in evaluate_clips(model, self.site(s).test, self.classes, device, self._bs(), **self.scoring).items()})
        # pooled test = frame-weighted mean of the sites' per-frame scores
        n = np.array([len(self.site(s).test) for s in self.spec.task_params["sites"]], dtype=float)
        row = {f"global_{k}": float(np.average([c[f"local_{k}"] for c in per_client], weights=n)) for k in self.metric_names}
        return row, per_client

    def evaluate_client(self, model, data, device):
        model.set_indicator(data.indicator)
        out = {f"local_{k}": v for k, v in evaluate_clips(model, data.test, self.classes, device, self._bs(), **self.scoring).items()}
        if self.spec.task_params.get("cross_site_eval", True):
            out.update({f"global_{k}": v for k, v in evaluate_clips(model, self.pooled_test(), self.classes, device, self._bs(), **self.scoring).items()})
        else:
            out.update({f"global_{k}": math.nan for k in self.metric_names})
        return out
