"""Decoded, resized surgical clips kept on disk, shared by every fedst job (``engine.image_cache``).

A clip's entry is what ``ClipSet`` makes of it after every check: its distinct frames resized, their
order in the clip and its resized mask, in one uncompressed ``.npz`` keyed by the files' resolved
paths, sizes and modification times and the size they are resized to. Reading an entry gives the same
bits as decoding the files again (a 1920x1080 PNG frame takes tens of milliseconds to decode and
resize; its entry loads in about one). A clip is decoded once for every job, round and site that
reads it; a file changed later gets a new key. Entries are written under a temporary name and
renamed; a damaged one is decoded and written again; below ``MIN_FREE`` bytes of free disk nothing
more is written (said once) and clips are decoded as they are read.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

from fedmedbench.workflow import io

#: free disk left alone (no entry is written below it)
MIN_FREE = 1 << 30


class ClipStore:
    """The entries under ``folder`` (made if missing)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(f"engine.image_cache: cannot make the folder {self.folder} ({err})") from err
        self.full = False

    def path(self, files: list[str], size: tuple[int, int] | None) -> Path | None:
        """The entry of a clip read from ``files`` (its frames in clip order, repeats included, then its mask) at
        ``size``; None where a file is missing (the decode names it)."""
        parts = []
        for f in files:
            try:
                real = Path(f).resolve()
                st = real.stat()
            except OSError:
                return None
            parts.append(f"{real}|{st.st_size}|{st.st_mtime_ns}")
        digest = hashlib.sha1("\n".join([*parts, str(size)]).encode()).hexdigest()
        return self.folder / digest[:2] / f"{digest[2:22]}.npz"

    @staticmethod
    def load(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(distinct frames, their order, mask), or None where there is no readable entry."""
        try:
            with np.load(path, allow_pickle=False) as z:
                return z["frames"], z["order"], z["mask"]
        except Exception:  # missing, or damaged (a full disk, a killed writer elsewhere): decoded again
            return None

    def save(self, path: Path, frames: np.ndarray, order: np.ndarray, mask: np.ndarray) -> None:
        if self.full:
            return
        if shutil.disk_usage(self.folder).free < MIN_FREE + frames.nbytes + mask.nbytes:
            self._stop(f"under {MIN_FREE >> 30} GiB free")
            return
        try:
            with io.atomic_path(path) as tmp, open(tmp, "wb") as fh:  # a handle: np.savez renames bare paths
                np.savez(fh, frames=frames, order=order, mask=mask)
        except OSError as err:
            self._stop(str(err))

    def _stop(self, why: str) -> None:
        self.full = True
        print(f"image cache: {self.folder}: {why}; no more clips written there, the rest decoded as they are read",
              flush=True)
