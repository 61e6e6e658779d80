"""Logging for Snakemake entry scripts: everything a job prints goes to its ``log:`` file.

A few lines (one per training round) also go to the console Snakemake runs in, so a user sees
each running job's progress without opening ``logs/``; the log file keeps the full record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path


class JobLog:
    """``log(msg)`` writes a time-stamped line to the job's log; ``log.console(msg)`` also to the console."""

    def __init__(self, fh, console_fd: int | None) -> None:
        self._fh = fh
        self._console_fd = console_fd

    def __call__(self, msg: str) -> None:
        self._fh.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n")
        self._fh.flush()

    def console(self, msg: str) -> None:
        self(msg)
        if self._console_fd is not None:
            try:
                os.write(self._console_fd, f"[{time.strftime('%H:%M:%S')}] {msg}\n".encode())
            except OSError:  # console gone (e.g. the terminal closed): the log file has the line
                pass


@contextlib.contextmanager
def log_to(path: str | os.PathLike, config_key: str | None = None) -> Iterator[JobLog]:
    """Redirect stdout/stderr (file descriptors too, so Ray/Flower output lands there).

    Yields a :class:`JobLog`: ``log(msg)`` writes one time-stamped line, ``log.console(msg)``
    writes it to the console (the stderr Snakemake gave the job) as well. An exception is written
    to the log with its traceback; the console gets one line (the error, ``config_key`` and the
    config file that sets it, the log's path) and the script exits with status 1.
    ``FEDMEDBENCH_DEBUG=1`` re-raises instead, so the traceback reaches the console too.
    """
    from fedmedbench.workflow import diagnostics

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    failed: BaseException | None = None
    with open(path, "a", buffering=1) as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        old_streams = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = fh
        logging.basicConfig(stream=fh, level=logging.WARNING, force=True)
        try:
            yield JobLog(fh, saved[1])
        except BaseException as exc:
            import traceback

            fh.write(traceback.format_exc())
            if not isinstance(exc, Exception) or diagnostics.debug():
                raise
            failed = exc
        finally:
            fh.flush()
            sys.stdout, sys.stderr = old_streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if failed is not None:
        print(diagnostics.job_error_line(failed, path, config_key), file=sys.stderr, flush=True)
        raise SystemExit(1)
