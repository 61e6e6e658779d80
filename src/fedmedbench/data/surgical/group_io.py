"""Write a re-curated group to disk (the output of the ``recurate_videos`` rule) and read it back.

Folder ``<group>/`` (written atomically)::

    group.json                          classes, clients, fixed val/test videos, pool, excluded videos
    <setting>/frames.parquet            client, split, dataset, video_id, frame, timestamp_s, image_path,
                                        width, height, boxes (after class restriction), n_removed
    <setting>/setting.json              scheme, parameters, per client: train/val/test videos, classes
    <setting>/stats.csv, stats.md       frames, videos, boxes per class per client and split
    <setting>/distribution[_synthetic].png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from fedmedbench.data.surgical.fsutil import atomic_dir
from fedmedbench.data.surgical.recurate import Group
from fedmedbench.data.surgical.stats import distribution_figure, setting_stats


def _keys(videos) -> list[str]:
    return [f"{d}/{v}" for d, v in videos]


def write_group(group: Group, out_dir: str | Path, origin: str) -> None:
    tag = "_synthetic" if origin == "synthetic" else ""
    with atomic_dir(out_dir) as tmp:
        doc = {"group": group.name, "origin": origin, "classes": group.classes, "num_clients": group.num_clients,
               "val": [_keys(c) for c in group.val], "test": [_keys(c) for c in group.test],
               "pool": _keys(group.pool), "excluded": _keys(group.excluded),
               "video_split": {f"{d}/{v}": s for (d, v), s in sorted(group.video_split.items())},
               "video_frames": {f"{d}/{v}": n for (d, v), n in sorted(group.lengths.items())},
               "settings": list(group.settings)}
        (tmp / "group.json").write_text(json.dumps(doc, indent=1) + "\n")
        for st in group.settings.values():
            sdir = tmp / st.name
            sdir.mkdir()
            st.frames.to_parquet(sdir / "frames.parquet", index=False)
            info = {"group": group.name, "setting": st.name, "scheme": st.scheme, "params": st.params, "origin": origin,
                    "classes": group.classes,
                    "clients": [{"client": k, "train": _keys(st.train[k]), "val": _keys(group.val[k]),
                                 "test": _keys(group.test[k]), "classes": st.classes[k]}
                                for k in range(group.num_clients)],
                    "unused_videos": _keys(group.unused(st))}
            (sdir / "setting.json").write_text(json.dumps(info, indent=1) + "\n")
            stats = setting_stats(st.frames, group.classes, group.num_clients, st.classes)
            stats.to_csv(sdir / "stats.csv", index=False)
            caption = ("SYNTHETIC data (demo): NOT a reproduction of any paper. " if origin == "synthetic" else "")
            unused = group.unused(st)
            (sdir / "stats.md").write_text(f"{caption}Group {group.name}, setting {st.name} ({st.scheme}); "
                                           f"videos used by no client: {len(unused)} {_keys(unused)}\n\n"
                                           + stats.to_markdown(index=False) + "\n")
            title = f"{group.name} / {st.name} ({st.scheme})" + (" - SYNTHETIC data, not a paper result" if tag else "")
            fig = distribution_figure(stats, group.classes, title)
            fig.savefig(sdir / f"distribution{tag}.png", dpi=110, bbox_inches="tight")
            plt.close(fig)


def read_setting(group_dir: str | Path, setting: str) -> tuple[pd.DataFrame, dict]:
    """Frames and setting.json of one setting of a re-curated group."""
    sdir = Path(group_dir) / setting
    if not (sdir / "frames.parquet").is_file():
        raise FileNotFoundError(f"{sdir}/frames.parquet: setting '{setting}' not found in {group_dir}")
    return pd.read_parquet(sdir / "frames.parquet"), json.loads((sdir / "setting.json").read_text())
