"""What every dataset adapter receives and returns (one module per on-disk layout)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedmedbench.data.surgical.badfiles import BadFiles, DatasetNotFoundError
from fedmedbench.data.surgical.facts import FRAME_RATES, frame_rate


@dataclass
class AdapterContext:
    """Inputs of an adapter: the dataset folder, its resolved options, the bad-file collector.

    ``mask_dir`` is where segmentation adapters write canonical masks (inside the temp
    folder of the index output, so they appear atomically with the index); ``mask_dir_final``
    is where that folder will be once the index is complete (the path the index records).
    """

    name: str
    root: Path
    options: dict
    bad: BadFiles
    mask_dir: Path
    mask_dir_final: Path
    log: Callable[[str], None] = print
    notes: list[str] = field(default_factory=list)
    #: sanitised mask folder name -> the video id that owns it (two videos must never share one)
    mask_folders: dict[str, str] = field(default_factory=dict)

    def opt(self, key: str, default=None):
        """A dataset option; ``None`` in the config means "the layout's documented default"."""
        value = self.options.get(key)
        return default if value is None else value


def split_folders(ctx: AdapterContext, official: dict[str, str], layout: str) -> dict[str, str]:
    """The release's split folders present under the dataset root (folder -> split); none is an error."""
    split_dirs = ctx.opt("split_dirs", official)
    present = {d: s for d, s in split_dirs.items() if (ctx.root / d).is_dir()}
    if not present:
        raise DatasetNotFoundError(f"surgical dataset '{ctx.name}': none of the split folders {sorted(split_dirs)} exists "
                                   f"in {ctx.root}; not the {layout} layout (see docs/surgical_data.md)")
    return present


def resolve_fps(ctx: AdapterContext, official: float | None, required: bool) -> tuple[float | None, str]:
    """The frame rate of the frame numbers in file names: configured, else the release's documented rate.

    Returns (fps, source). Never guesses: a layout without a documented rate needs ``fps`` (or a
    listed ``release``, :data:`~fedmedbench.data.surgical.facts.FRAME_RATES`) in the config when
    ``required``; otherwise timestamps stay NaN and the meta says so.
    """
    configured = ctx.options.get("fps")
    if configured is not None:
        if configured <= 0:
            raise ValueError(f"surgical.datasets.{ctx.name}.fps must be > 0, got {configured}")
        return float(configured), "config"
    if official is not None:
        ctx.notes.append(f"fps {official} is the release's documented frame rate (surgical.datasets.{ctx.name}.fps: null)")
        return float(official), "official"
    listed = frame_rate(ctx.options.get("release"), ctx.name)
    if listed is not None:
        ctx.notes.append(f"fps {listed.fps} from release '{ctx.options['release']}' ({listed.basis}: {listed.source})")
        return listed.fps, f"release {ctx.options['release']} ({listed.basis})"
    if required:
        raise ValueError(f"surgical.datasets.{ctx.name}.fps is not set: the {ctx.options.get('layout')} layout does not "
                         "record a frame rate, so set the frame rate of the frame numbers in the file names "
                         f"(fps) or name a listed release (release: one of {sorted(FRAME_RATES)})")
    ctx.notes.append("no fps configured: timestamps are NaN (clip export needs surgical.datasets.<name>.fps)")
    return None, "none"


def timestamp(frame: int, fps: float | None) -> float:
    return float(frame) / fps if fps else math.nan
