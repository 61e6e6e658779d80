"""One process at a time trains a run: a lock in the run's folder, naming its holder.

Snakemake's own lock keeps two ``snakemake`` calls apart only until someone runs ``--unlock`` (or
``--nolock``) while the first still trains; the second would then train the same run beside it, each
removing the other's checkpoint files. :func:`run_lock` takes an exclusive POSIX lock (``fcntl.lockf``,
which NFS servers support through their lock manager) on ``<run_dir>/.run.lock`` and writes the holder's
PID, host and start time into it. The kernel releases the lock when the holder exits, however it
exits, so a killed job never blocks its rerun; a second process finds the lock held and stops
naming the holder.

A lock taken by the job's script comes late: Snakemake deletes a job's outputs and its log before the
script starts, and the outputs of a job that failed after it. So the workflow also refuses at its start
(``onstart`` in the Snakefile) every job whose run folder's lock is held (:func:`held_runs`, which
reads the lock without taking it), and the holder keeps a second name of its log beside its lock: a
second job refused here puts the holder's log back where Snakemake deleted it and appends its one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedmedbench.workflow.io import naming_full_disk

LOCK_NAME = ".run.lock"
#: the holder's log under a second name, beside its lock (a hard link: the same file)
LOG_LINK = ".run.lock.log"


class RunLockedError(RuntimeError):
    """Another process trains this run now."""

    #: True where the refusal's line went into the running job's log (:func:`run_lock`): no traceback is kept
    no_traceback = False


def _info(fd: int) -> dict:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    return info if isinstance(info, dict) else {}


def _holder(info: dict) -> str:
    if "pid" not in info:
        return "another process (it has not written its name yet)"
    return f"PID {info['pid']} on host {info.get('host', '?')} (since {info.get('started', '?')})"


class _Flock(ctypes.Structure):
    """Linux's ``struct flock`` (64-bit offsets), for asking who holds a lock without taking it."""

    _fields_ = [("l_type", ctypes.c_short), ("l_whence", ctypes.c_short), ("l_start", ctypes.c_int64),
                ("l_len", ctypes.c_int64), ("l_pid", ctypes.c_int32)]


def _is_held(fd: int) -> bool:
    """Whether another process holds a lock on the open file ``fd`` (Linux: ``F_GETLK``, nothing taken)."""
    if sys.platform.startswith("linux"):
        query = _Flock(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = _Flock.from_buffer_copy(fcntl.fcntl(fd, fcntl.F_GETLK, bytes(query)))
        return answer.l_type != fcntl.F_UNLCK
    try:  # elsewhere: a shared lock for an instant (a trainer starting in that instant would be refused)
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    fcntl.lockf(fd, fcntl.LOCK_UN)
    return False


def holder_of(run_dir: str | os.PathLike) -> str | None:
    """Who trains ``run_dir`` now (None: no process does); the lock is only looked at, never taken."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _holder(_info(fd)) if _is_held(fd) else None
    finally:
        os.close(fd)


def held_runs(run_dirs: Iterable[str | os.PathLike]) -> list[str]:
    """One line for each of ``run_dirs`` that a process trains now (a job for it must not start)."""
    lines = []
    for run_dir in sorted({str(d) for d in run_dirs}):
        who = holder_of(run_dir)
        if who is not None:
            lines.append(f"{run_dir}: this run is being trained by {who}")
    return lines


def refuse_held(run_dirs: Iterable[str | os.PathLike]) -> None:
    """Exit (status 1) with one line per run of ``run_dirs`` another process trains now: the workflow's check
    before its first job (Snakemake would delete such a job's log and outputs before its script could refuse)."""
    lines = held_runs(run_dirs)
    for line in lines:
        print(f"error: {line}; this snakemake would delete that job's log and outputs, so it runs no job. Wait for "
              "it to finish, or stop that process, then rerun", file=sys.stderr, flush=True)
    if lines:
        raise SystemExit(1)


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _keep_holders_log(run_dir: Path, info: dict, log: str | os.PathLike | None, line: str) -> bool:
    """Put the holder's log back at ``log`` (the same job's log, which Snakemake deleted before this process
    started) and append ``line`` to it; False where the holder kept no second name of it."""
    link = run_dir / LOG_LINK
    if log is None or not info.get("log") or not _same_file(info["log"], log) or not link.exists():
        return False
    tmp = Path(log).with_name(f".{Path(log).name}.{os.getpid()}.tmp")
    try:
        os.link(link, tmp)
        os.replace(tmp, log)
        with open(log, "a") as fh:
            fh.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, log: str | os.PathLike | None = None) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block, or raise :class:`RunLockedError` naming who holds it.

    ``log``: the job's log file. The holder keeps it under a second name beside the lock; a refused
    process with the same log puts the holder's back (Snakemake deleted it before the job started) and
    appends its one line there, so the running job's log is never replaced by the refusal's traceback."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    with naming_full_disk(path, "run lock"):
        run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                info = _info(fd)
                os.close(fd)
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    message = (f"{run_dir}: this run is being trained by {_holder(info)}; a second process must not "
                               f"train it too (it would remove the first one's checkpoint files). Wait for it to "
                               f"finish, or stop that process, then rerun (the lock is {path})")
                    kept = _keep_holders_log(run_dir, info, log, f"refused a second process (PID {os.getpid()} on "
                                                                 f"host {socket.gethostname()}) that asked to train this run")
                    error = RunLockedError(message + (f"; {log} stays the running job's log" if kept else ""))
                    error.no_traceback = kept
                    raise error from None
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:  # the previous holder removed the file between our open and our lock
                same = False
            if same:
                break
            os.close(fd)
    link = run_dir / LOG_LINK
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        with contextlib.suppress(OSError):  # another file system, say: the log then has one name only
            link.unlink(missing_ok=True)
            if log is not None and Path(log).is_file():
                os.link(log, link)
                info["log"] = str(log)
        with naming_full_disk(path, "run lock"):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before the release: a process that opened this file re-checks the inode
        os.close(fd)
