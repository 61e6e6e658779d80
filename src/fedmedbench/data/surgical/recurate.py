"""Video-level re-curation and the UltraFlwr client settings of one experiment group.

A group (``surgical.groups.<name>``: G_combined, G_track20) pools detection datasets,
splits them by video (:mod:`.splits`), gives every client a FIXED validation and test set
(the same in all of the group's settings, so settings compare fairly) and builds each
setting's training assignment:

* ``iid``: the training pool shuffled (seeded) and dealt video by video to the client with
  the fewest frames so far (random but balanced frame counts);
* ``curation``: client k takes training videos only from its ``sources[k]`` datasets; each
  dataset's training videos are dealt, longest first, to the sharing client with the fewest
  frames so far: every training video is used and clients of one dataset get balanced
  frame counts (UltraFlwr: "balanced with best effort across clients by matching video
  lengths across datasets"; its G_combined "provides more data" than G_track20). With
  ``match_lengths`` (an option, not the default) every client is instead only filled towards
  the frame count of the smallest one and the videos left over are unused;
* ``length``: the pool sorted by video length and cut into contiguous runs, client 0 the
  longest videos (``balance: frames`` chooses the cuts that equalise frame counts best,
  ``videos`` equal video counts);
* ``lmo`` (leave multiple out): the training videos of setting ``base``, with each client
  keeping only the boxes of its ``client_classes`` (``all``, a ``surgical.tool_groups``
  name, or a class list); boxes of other classes are removed from the splits in
  ``restrict_splits`` (default the training split only).

The group's training pool is every training video, or, with ``pool_from: <setting>``, the
videos that setting uses (G_combined pools exactly the videos of its curation setting).
Training videos never overlap across clients and no video is in two splits: every
setting is checked (:func:`check_no_leakage`) before it is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedmedbench.data.surgical import splits as S
from fedmedbench.data.surgical.schema import TOOL_CLASSES, dump_boxes, parse_boxes

VideoKey = tuple[str, str]  # (dataset, video_id)
SCHEMES = ("iid", "curation", "length", "lmo")


@dataclass
class Setting:
    name: str
    scheme: str
    params: dict
    train: list[list[VideoKey]]
    classes: list[list[str]]
    frames: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass
class Group:
    name: str
    classes: list[str]
    num_clients: int
    lengths: dict[VideoKey, int]
    video_split: dict[VideoKey, str]
    val: list[list[VideoKey]]
    test: list[list[VideoKey]]
    pool: list[VideoKey]
    excluded: list[VideoKey]
    settings: dict[str, Setting]

    def unused(self, setting: Setting) -> list[VideoKey]:
        used = {v for c in setting.train for v in c} | {v for c in self.val for v in c} | {v for c in self.test for v in c}
        return sorted(set(self.lengths) - used)


# --- inputs ------------------------------------------------------------------------------------

def prepare_frames(indices: dict[str, pd.DataFrame], cfg: dict) -> tuple[pd.DataFrame, list[VideoKey]]:
    """The group's frames: its datasets' detection indices minus excluded videos, subsampled."""
    parts, excluded = [], []
    for d in cfg["datasets"]:
        df = indices[d]
        if (df["boxes"] == "").all():
            raise ValueError(f"group dataset '{d}' has no boxes: re-curation and YOLO export need a detection dataset")
        drop = {str(v) for v in (cfg.get("exclude_videos") or {}).get(d, [])}
        unknown = drop - set(df["video_id"])
        if unknown:
            raise ValueError(f"exclude_videos.{d}: {sorted(unknown)} not in the index of '{d}'")
        excluded += [(d, v) for v in sorted(drop)]
        df = df[~df["video_id"].isin(drop) & df["labelled"]]
        step = int((cfg.get("frame_step") or {}).get(d, 1))
        if step < 1:
            raise ValueError(f"frame_step.{d} must be >= 1")
        if step > 1:  # keep every step-th annotated frame of each video
            df = df.sort_values(["video_id", "frame"])
            df = df[df.groupby("video_id").cumcount() % step == 0]
        parts.append(df)
    return pd.concat(parts, ignore_index=True), excluded


def group_classes(metas: dict[str, dict], cfg: dict) -> list[str]:
    if cfg.get("classes"):
        return list(cfg["classes"])
    seen = [c for d in cfg["datasets"] for c in metas[d]["classes"]]
    return [c for c in TOOL_CLASSES if c in seen] + sorted(set(seen) - set(TOOL_CLASSES))


# --- assignment helpers --------------------------------------------------------------------------

def _lpt(videos: list[VideoKey], lengths, bins: int, load=None) -> list[list[VideoKey]]:
    """Longest video first to the bin with the fewest frames (deterministic, balanced)."""
    out = [[] for _ in range(bins)]
    load = list(load) if load is not None else [0] * bins
    for v in sorted(videos, key=lambda v: (-lengths[v], v)):
        k = int(np.argmin(load))
        out[k].append(v)
        load[k] += lengths[v]
    return out


def eval_assignment(lengths, video_split, cfg, n: int) -> dict[str, list[list[VideoKey]]]:
    """Fixed per-client val/test videos: each dataset's videos shared among the clients that draw on it."""
    sources = cfg.get("eval_sources") or [list(cfg["datasets"])] * n
    if len(sources) != n:
        raise ValueError(f"eval_sources has {len(sources)} entries for {n} clients")
    out = {}
    for split in ("val", "test"):
        clients = [[] for _ in range(n)]
        load = [0] * n
        for d in cfg["datasets"]:
            sharers = [k for k in range(n) if d in sources[k]]
            pool = [v for v, s in video_split.items() if s == split and v[0] == d]
            if not sharers:
                continue
            if len(pool) < len(sharers):
                raise ValueError(f"dataset '{d}' has {len(pool)} {split} video(s) for {len(sharers)} clients; every "
                                 f"client needs its own {split} videos (change video_splits.{d})")
            for k, vids in zip(sharers, _lpt(pool, lengths, len(sharers), [load[k] for k in sharers]), strict=True):
                clients[k] += vids
                load[k] += sum(lengths[v] for v in vids)
        empty = [k for k in range(n) if not clients[k]]
        if empty:
            raise ValueError(f"client(s) {empty} get no {split} video; check eval_sources and video_splits")
        out[split] = clients
    return out


def scheme_iid(pool, lengths, n, seed) -> list[list[VideoKey]]:
    out, load = [[] for _ in range(n)], [0] * n
    order = np.random.default_rng(seed).permutation(len(pool))
    for i in order:
        v = pool[i]
        k = int(np.argmin(load))
        out[k].append(v)
        load[k] += lengths[v]
    return out


def scheme_curation(candidates, lengths, n, sources, match_lengths) -> list[list[VideoKey]]:
    if not sources or len(sources) != n:
        raise ValueError(f"curation: needs one list of datasets per client ({n}) in 'sources' or the group's "
                         f"'eval_sources', got {sources}")
    by_ds: dict[str, list[VideoKey]] = {}
    for v in candidates:
        by_ds.setdefault(v[0], []).append(v)
    sharers = {d: [k for k in range(n) if d in sources[k]] for d in by_ds}
    for k, src in enumerate(sources):
        if not any(d in by_ds for d in src):
            raise ValueError(f"curation: client {k}'s sources {src} have no training videos")
    target = None
    if match_lengths:
        achievable = [sum(sum(lengths[v] for v in by_ds.get(d, [])) / max(1, len(sharers.get(d, []))) for d in src)
                      for src in sources]
        target = min(achievable)
    out, load = [[] for _ in range(n)], [0] * n
    for d in sorted(by_ds):
        ks = sharers[d]
        if not ks:
            continue
        if target is None:
            for k, vids in zip(ks, _lpt(by_ds[d], lengths, len(ks), [load[k] for k in ks]), strict=True):
                out[k] += vids
                load[k] += sum(lengths[v] for v in vids)
            continue
        for v in sorted(by_ds[d], key=lambda v: (-lengths[v], v)):
            gains = [(abs(load[k] - target) - abs(load[k] + lengths[v] - target), -load[k], -k) for k in ks]
            best = max(range(len(ks)), key=lambda i: gains[i])
            if gains[best][0] > 0:
                out[ks[best]].append(v)
                load[ks[best]] += lengths[v]
    return out


def _linear_partition(sizes: list[int], n: int) -> list[int]:
    """Cut points splitting ``sizes`` (in order) into n contiguous non-empty runs minimising the largest run."""
    m = len(sizes)
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    inf = float("inf")
    cost = np.full((n + 1, m + 1), inf)
    cut = np.zeros((n + 1, m + 1), dtype=int)
    cost[0, 0] = 0
    for j in range(1, n + 1):
        for i in range(j, m + 1):
            for c in range(j - 1, i):
                val = max(cost[j - 1, c], prefix[i] - prefix[c])
                if val < cost[j, i]:
                    cost[j, i], cut[j, i] = val, c
    cuts, i = [], m
    for j in range(n, 0, -1):
        cuts.append(i)
        i = cut[j, i]
    return [0] + sorted(cuts)


def scheme_length(pool, lengths, n, balance) -> list[list[VideoKey]]:
    ordered = sorted(pool, key=lambda v: (-lengths[v], v))
    if len(ordered) < n:
        raise ValueError(f"length: {len(ordered)} training videos for {n} clients")
    if balance == "videos":
        return [list(chunk) for chunk in np.array_split(np.array(ordered, dtype=object), n)]
    b = _linear_partition([lengths[v] for v in ordered], n)
    return [ordered[b[k]:b[k + 1]] for k in range(n)]


def client_class_sets(spec: list, classes: list[str], tool_groups: dict, n: int) -> list[list[str]]:
    if len(spec) != n:
        raise ValueError(f"lmo: client_classes has {len(spec)} entries for {n} clients")
    out = []
    for k, item in enumerate(spec):
        if item == "all":
            chosen = list(classes)
        elif isinstance(item, str):
            if item not in tool_groups:
                raise ValueError(f"lmo: client {k}: '{item}' is neither 'all' nor a surgical.tool_groups name "
                                 f"{sorted(tool_groups)}")
            chosen = list(tool_groups[item])
        else:
            chosen = list(item)
        unknown = [c for c in chosen if c not in classes]
        if unknown:
            raise ValueError(f"lmo: client {k}: classes {unknown} are not classes of the group {classes}")
        out.append([c for c in classes if c in chosen])
    return out


# --- the group -----------------------------------------------------------------------------------

def _order(settings: dict, pool_from: str | None) -> list[str]:
    """Settings in dependency order (the pool setting first, lmo after its base)."""
    done: list[str] = []

    def visit(name, stack=()):
        if name in done:
            return
        if name not in settings:
            raise ValueError(f"setting '{name}' referenced but not defined (settings: {sorted(settings)})")
        if name in stack:
            raise ValueError(f"settings {list(stack)} depend on each other in a cycle")
        s = settings[name]
        if s["scheme"] == "lmo":
            if settings.get(s.get("base"), {}).get("scheme") == "lmo":
                raise ValueError(f"lmo setting '{name}': base '{s.get('base')}' must not be an lmo setting")
            visit(s.get("base"), stack + (name,))
        elif pool_from and name != pool_from and s["scheme"] in ("iid", "length"):
            visit(pool_from, stack + (name,))
        done.append(name)

    if pool_from:
        visit(pool_from)
        if settings[pool_from]["scheme"] != "curation":
            raise ValueError(f"pool_from: '{pool_from}' must be a curation setting")
    for name in settings:
        visit(name)
    return done


def build_group(name: str, indices: dict[str, pd.DataFrame], metas: dict[str, dict], cfg: dict,
                tool_groups: dict) -> Group:
    n = int(cfg["num_clients"])
    seed = int(cfg.get("seed", 0))
    frames, excluded = prepare_frames(indices, cfg)
    lengths = {(d, v): int(c) for (d, v), c in frames.groupby(["dataset", "video_id"]).size().items()}
    video_split: dict[VideoKey, str] = {}
    for d in cfg["datasets"]:
        spec = (cfg.get("video_splits") or {}).get(d)
        for vid, split in S.resolve(frames[frames["dataset"] == d], d, spec, seed).items():
            video_split[(d, vid)] = split
    ev = eval_assignment(lengths, video_split, cfg, n)
    candidates = sorted(v for v, s in video_split.items() if s == "train")
    classes = group_classes(metas, cfg)
    settings: dict[str, Setting] = {}
    pool_from = cfg.get("pool_from")
    pool = candidates
    for sname in _order(cfg["settings"], pool_from):
        s = cfg["settings"][sname]
        scheme = s["scheme"]
        all_classes = [list(classes) for _ in range(n)]
        if scheme == "curation":
            train = scheme_curation(candidates, lengths, n, s.get("sources") or cfg.get("eval_sources"),
                                    bool(s.get("match_lengths", False)))
        elif scheme == "iid":
            train = scheme_iid(pool, lengths, n, int(s.get("seed", seed)))
        elif scheme == "length":
            train = scheme_length(pool, lengths, n, s.get("balance", "frames"))
        elif scheme == "lmo":
            base = settings[s["base"]]
            train = [list(c) for c in base.train]
            all_classes = client_class_sets(s["client_classes"], classes, tool_groups, n)
        else:
            raise ValueError(f"setting '{sname}': unknown scheme '{scheme}' (known: {SCHEMES})")
        empty = [k for k in range(n) if not train[k]]
        if empty:
            raise ValueError(f"group '{name}', setting '{sname}': client(s) {empty} get no training video")
        settings[sname] = Setting(sname, scheme, dict(s), train, all_classes)
        if sname == pool_from:
            pool = sorted(v for c in train for v in c)
    group = Group(name, classes, n, lengths, video_split, ev["val"], ev["test"], pool, excluded,
                  {k: settings[k] for k in cfg["settings"]})
    for st in group.settings.values():
        st.frames = setting_frames(group, st, frames)
        check_no_leakage(st.frames, f"group '{name}', setting '{st.name}'")
    return group


def setting_frames(group: Group, st: Setting, frames: pd.DataFrame) -> pd.DataFrame:
    """One row per (client, split, frame) with the boxes the client may see."""
    restrict = set(st.params.get("restrict_splits") or ["train"]) if st.scheme == "lmo" else set()
    by_video = {k: g for k, g in frames.groupby(["dataset", "video_id"], sort=False)}
    parts = []
    for k in range(group.num_clients):
        for split, videos in (("train", st.train[k]), ("val", group.val[k]), ("test", group.test[k])):
            for v in videos:
                g = by_video[v].drop(columns=["split"])  # the release's split is replaced by the video-level one
                g.insert(0, "split", split)
                g.insert(0, "client", k)
                if split in restrict:
                    keep = set(st.classes[k])
                    boxes = [parse_boxes(b) for b in g["boxes"]]
                    g["boxes"] = [dump_boxes([b for b in bs if b.cls in keep]) for bs in boxes]
                    g["n_removed"] = [sum(b.cls not in keep for b in bs) for bs in boxes]
                else:
                    g["n_removed"] = 0
                parts.append(g)
    out = pd.concat(parts, ignore_index=True)
    cols = ["client", "split", "dataset", "video_id", "frame", "timestamp_s", "image_path", "width", "height", "boxes",
            "n_removed"]
    return out[cols].sort_values(["client", "split", "dataset", "video_id", "frame"], kind="stable").reset_index(drop=True)


def check_no_leakage(df: pd.DataFrame, where: str) -> None:
    """No video in two splits, no training video at two clients, no val/test video at two clients."""
    per_video = df.groupby(["dataset", "video_id"]).agg(splits=("split", "nunique"), clients=("client", "nunique"))
    two_splits = per_video[per_video["splits"] > 1]
    if len(two_splits):
        raise S.LeakageError(f"{where}: video(s) {list(two_splits.index)[:5]} appear in two splits")
    two_clients = per_video[per_video["clients"] > 1]
    if len(two_clients):
        raise S.LeakageError(f"{where}: video(s) {list(two_clients.index)[:5]} are used by two clients")
