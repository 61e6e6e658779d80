"""A run's working files: ``<run_dir>/work/``, removed once the run's outputs are written.

What a task writes there is only for the run while it runs: the detection task's staged views of
the YOLO export (one symlink per frame of every split, the pooled set's too, and the ``.npy`` links of
``engine.image_cache``), Ultralytics' ``labels.cache`` beside them and its per-training folders. At the
papers' frame counts that is about 100,000 entries a job (twice as many with the frame cache), each link an
inode and, with a long target path, a disk block: about 40 times the job's results (docs/benchmarks.md §7).
Nothing reads it after the run, and a rerun stages afresh.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from pathlib import Path

WORK = "work"
_REMOVING = ".work.removing."


def scratch_dir(run_dir: str | Path) -> Path:
    """The run's working folder (absolute: Ultralytics resolves data paths against it)."""
    return Path(run_dir).resolve() / WORK


def usage(folder: Path) -> tuple[int, int]:
    """(bytes on disk, entries) of ``folder``'s tree, links counted as themselves, never their targets."""
    size, entries = 0, 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            size += st.st_blocks * 512
            entries += 1
    return size, entries


def release(run_dir: str | Path, keep: bool = False) -> tuple[int, int, list[str]]:
    """Remove the run's working folder (unless ``keep``): (bytes on disk, entries) freed and the
    paths that could not be removed, with why (the run's outputs are written by then: a failure to
    tidy up is reported, not raised).

    Renamed out of the way first, so a kill half-way through never leaves a partial stage that a rerun
    would take for a complete one; what such a kill left is removed by the next release.
    """
    run = Path(run_dir)
    folder = scratch_dir(run)
    if keep or not run.is_dir():
        return 0, 0, []
    size, entries, failed = 0, 0, []

    def note(_function, path: str, error) -> None:
        error = error if isinstance(error, BaseException) else error[1]  # onexc's exception or onerror's exc_info
        if not (isinstance(error, OSError) and error.errno == errno.ENOTEMPTY):  # a folder's, not its own cause
            failed.append(f"{path}: {error}")

    handler = {"onexc": note} if sys.version_info >= (3, 12) else {"onerror": note}

    if folder.exists():
        size, entries = usage(folder)
        os.rename(folder, run / f"{_REMOVING}{os.getpid()}.{time.time_ns()}")
    for left in sorted(run.glob(f"{_REMOVING}*")):
        shutil.rmtree(left, **handler)
    return size, entries, failed
