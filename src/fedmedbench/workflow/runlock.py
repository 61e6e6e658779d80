"""One process at a time trains a run: a lock in the run's folder, naming its holder.

Snakemake's own lock keeps two ``snakemake`` calls apart only until someone runs ``--unlock`` while
the first still trains; the second would then train the same run beside it, each removing the
other's checkpoint files. :func:`run_lock` takes an exclusive POSIX lock (``fcntl.lockf``, which
NFS servers support through their lock manager) on ``<run_dir>/.run.lock`` and writes the holder's
PID, host and start time into it. The kernel releases the lock when the holder exits, however it
exits, so a killed job never blocks its rerun; a second process finds the lock held and stops
naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".run.lock"


class RunLockedError(RuntimeError):
    """Another process trains this run now."""


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not written its name yet)"
    return f"PID {info['pid']} on host {info.get('host', '?')} (since {info.get('started', '?')})"


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block, or raise :class:`RunLockedError` naming who holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise RunLockedError(
                    f"{run_dir}: this run is being trained by {holder}; a second process must not train it too "
                    f"(it would remove the first one's checkpoint files). Wait for it to finish, or stop that "
                    f"process, then rerun (the lock is {path})") from None
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:  # the previous holder removed the file between our open and our lock
            same = False
        if same:
            break
        os.close(fd)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before the release: a process that opened this file re-checks the inode
        os.close(fd)
