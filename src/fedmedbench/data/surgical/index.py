"""Index one surgical dataset: pick the adapter of its layout, apply the bad-file policy, write the index.

Output folder (written atomically)::

    index.parquet    one row per frame (columns: fedmedbench.data.surgical.schema)
    bad_files.csv    path, video_id, frame, reason (header only when there is none)
    meta.json        layout, task, classes, fps and where it came from, counts, notes
    masks/           canonical masks of segmentation datasets
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from fedmedbench.data.surgical import (
    cholectrack20,
    coco_folder,
    endovis2017,
    endovis2018,
    frames_masks,
    m2cai16,
    yolo_folder,
)
from fedmedbench.data.surgical.badfiles import BadFiles
from fedmedbench.data.surgical.base import AdapterContext
from fedmedbench.data.surgical.fsutil import atomic_dir, dataset_dir
from fedmedbench.data.surgical.schema import to_frame, validate_index

#: layout name (``surgical.datasets.<name>.layout``) -> adapter module
LAYOUTS: dict[str, ModuleType] = {
    "m2cai16": m2cai16,
    "cholectrack20": cholectrack20,
    "yolo": yolo_folder,
    "coco": coco_folder,
    "endovis2017": endovis2017,
    "endovis2018": endovis2018,
    "frames_masks": frames_masks,
}


def adapter(layout: str) -> ModuleType:
    try:
        return LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown surgical layout '{layout}'; known: {sorted(LAYOUTS)}") from None


def build_index(name: str, cfg: dict, root: str | Path | None, out_dir: str | Path, policy: str = "fail",
                origin: str = "real", log: Callable[[str], None] = print) -> dict:
    """Index dataset ``name`` (its config block ``cfg``) found in ``root/<cfg['folder']>`` into ``out_dir``.

    Raises ``DatasetNotFoundError`` when the folder is missing and ``BadFileError`` under the
    ``fail`` policy; in both cases ``out_dir`` is left untouched. Returns the meta dict.
    """
    module = adapter(cfg["layout"])
    folder = dataset_dir(root, cfg["folder"], name)
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        ctx = AdapterContext(name=name, root=folder, options=cfg, bad=BadFiles(name, policy), mask_dir=tmp / "masks",
                             mask_dir_final=out_dir.resolve() / "masks", log=log)
        rows, info = module.index(ctx)
        report = ctx.bad.finish()
        df = to_frame(rows)
        if df.empty:
            raise ValueError(f"surgical dataset '{name}': no frames found in {folder} "
                             f"({len(report)} bad file(s)); is it the {cfg['layout']} layout?")
        validate_index(df, f"surgical dataset '{name}'")
        df.to_parquet(tmp / "index.parquet", index=False)
        report.to_csv(tmp / "bad_files.csv", index=False)
        videos = df.groupby("video_id", sort=True).size()
        meta = {"dataset": name, "layout": cfg["layout"], "origin": origin, "source": str(folder),
                "bad_files_policy": policy, **info, "n_frames": int(len(df)), "n_labelled": int(df["labelled"].sum()),
                "n_videos": int(len(videos)), "n_bad_files": int(len(report)),
                "frames_per_video": {str(k): int(v) for k, v in videos.items()}, "notes": ctx.notes}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"{name}: {meta['n_frames']} frames in {meta['n_videos']} videos, {meta['n_bad_files']} bad file(s) "
        f"[{cfg['layout']}, fps {meta.get('fps')} ({meta.get('fps_source')})]")
    for note in ctx.notes:
        log(f"{name}: {note}")
    return meta
