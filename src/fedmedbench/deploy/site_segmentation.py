"""Segmentation site folders: the site's clips exactly as the segmentation task reads them.

``frames/`` and ``masks/`` hold copies of every frame and mask file of the site's training
and test clips (each source file once, numbered; bytes unchanged, so they decode to the same
pixels); ``clips.json`` lists, per split and in the task's order, each clip's frame files
(oldest .. current) and its mask; ``indicator.npy`` is the site's fixed indicator vector
(computed at export from every site's identity, e.g. CLIP text embeddings, which a site could
not compute alone). With ``task_params.synthetic_mix`` the mixed-in synthetic clips are part of
the site's training clips and are exported with them.

A site scores its own model on its own test clips (``local_*``); the pooled test set of all
sites is other sites' data, so ``global_*`` is NaN at a site.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench.deploy.site_data import Site, SiteDataError, list_files
from fedmedbench.fl.tasks.segmentation import (
    ClipSet,
    FrameCache,
    SiteData,
    evaluate_clips,
    input_size,
    metric_names,
    scoring,
)
from fedmedbench.fl.tasks.segmentation.task import SegmentationTask

CLIPS = "clips.json"
INDICATOR = "indicator.npy"
SPLITS = ("train", "test")


def num_clients(spec) -> int:
    return len(spec.task_params["sites"])


def export(spec, pid: int, folder: Path) -> dict[str, Any]:
    task = SegmentationTask(spec)
    site = task.client_data(pid)
    copied: dict[str, str] = {}

    def copy(src: str, kind: str) -> str:
        if src not in copied:
            name = f"{kind}/{len(copied):06d}{Path(src).suffix}"
            (folder / kind).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, folder / name)
            copied[src] = name
        return copied[src]

    clips = {}
    for split in SPLITS:
        cs: ClipSet = getattr(site, split)
        clips[split] = [{"clip_paths": [copy(p, "frames") for p in paths], "mask_path": copy(mask, "masks")}
                        for paths, mask in zip(cs.clip_paths, cs.mask_paths, strict=True)]
    (folder / CLIPS).write_text(json.dumps(clips, indent=1))
    np.save(folder / INDICATOR, site.indicator.numpy(), allow_pickle=False)
    info = task.all_sites[site.site]
    return {"site": site.site, "index": site.index, "prompt": site.prompt, "classes": list(info["classes"]),
            "counts": {s: len(clips[s]) for s in SPLITS},
            "files": list_files(folder, [*copied.values(), CLIPS, INDICATOR])}


def load(folder: Path, manifest: dict[str, Any], spec) -> Site:
    tp = spec.task_params
    num_frames = len(tp["model"].get("pools", [7, 4, 2, 1]))
    size = input_size(tp.get("input_size"))
    cache = FrameCache(int(tp.get("cache_mb", 2048)) * 2**20)
    clips = json.loads((folder / CLIPS).read_text())
    sets = {}
    for split in SPLITS:
        rows = clips[split]
        bad = [len(r["clip_paths"]) for r in rows if len(r["clip_paths"]) != num_frames]
        if bad:
            raise SiteDataError(f"{folder / CLIPS}: {split} clips have {bad[0]} frames, the server's model is "
                                f"configured for {num_frames}")
        sets[split] = ClipSet([[str(folder / p) for p in r["clip_paths"]] for r in rows],
                              [str(folder / r["mask_path"]) for r in rows], f"{folder / CLIPS} [{split}]", size, cache)
    local_steps = tp.get("local_steps")
    data = SiteData(site=manifest["site"], index=int(manifest["index"]), prompt=manifest["prompt"], train=sets["train"],
                    test=sets["test"], indicator=torch.from_numpy(np.load(folder / INDICATOR, allow_pickle=False)),
                    loss=dict(tp.get("loss", {})), local_steps=None if local_steps is None else int(local_steps))
    classes = {i: c for i, c in enumerate(manifest["classes"]) if i > 0}
    names = metric_names(classes)
    bs = int(tp.get("eval_batch_size", 8))

    def evaluate(model: torch.nn.Module, data: SiteData, device: torch.device) -> dict[str, float]:
        model.set_indicator(data.indicator)
        out = {f"local_{k}": v for k, v in evaluate_clips(model, data.test, classes, device, bs, **scoring(tp)).items()}
        out.update({f"global_{k}": math.nan for k in names})
        return out

    return Site(data, evaluate)
