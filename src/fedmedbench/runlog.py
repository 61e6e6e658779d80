"""Logging for Snakemake entry scripts: everything a job prints goes to its ``log:`` file."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def log_to(path: str | os.PathLike) -> Iterator[callable]:
    """Redirect stdout/stderr (file descriptors too, so Ray/Flower output lands there).

    Yields a ``log(msg)`` function that writes one time-stamped line. An exception is
    written to the log with its traceback, then re-raised (Snakemake reports the log).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", buffering=1) as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        old_streams = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = fh
        logging.basicConfig(stream=fh, level=logging.WARNING, force=True)

        def log(msg: str) -> None:
            fh.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n")
            fh.flush()

        try:
            yield log
        except BaseException:
            import traceback

            fh.write(traceback.format_exc())
            raise
        finally:
            fh.flush()
            sys.stdout, sys.stderr = old_streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
