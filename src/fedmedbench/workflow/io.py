"""Atomic file writes: an output appears only when it is complete.

Every writer goes through :func:`atomic_path`: write to a temporary file in the
destination folder, flush it to disk, then ``os.replace`` it over the target. A
killed job (or a full disk) leaves the previous version or nothing, never half a
file; the temp file is removed on error. A full disk (or quota) is reported naming the folder
and the file (:func:`naming_full_disk`), whatever library was writing.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to ``target``; move it into place if the block succeeds.

    The temp name ends with the target's extension, so libraries that pick a format
    from it (matplotlib, numpy) write the right thing.
    """
    target = Path(target)
    with naming_full_disk(target, "file"):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp" + target.suffix, dir=target.parent)
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        with naming_full_disk(target, "file"):
            yield tmp_path
            _fsync_file(tmp_path)
        _fault_injection(target)
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; outputs get normal permissions
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def naming_full_disk(target: str | os.PathLike, what: str) -> Iterator[None]:
    """Report a full disk or quota met inside the block as ``No space left on <folder> while writing the
    <what> <name>`` (the library that was writing says only "No space left on device")."""
    try:
        yield
    except OSError as exc:
        full = disk_full_error(exc, Path(target), what)
        if full is not None:
            raise full from exc
        raise


#: Fault injection for the kill-anywhere tests: a glob; a process writing a matching target
#: SIGKILLs itself after the temp file is complete and before the rename (the worst moment).
FAULT_ENV = "FEDMEDBENCH_FAULT_KILL_BEFORE_RENAME"


def _fault_injection(target: Path) -> None:
    pattern = os.environ.get(FAULT_ENV)
    if pattern and fnmatch.fnmatch(str(target), pattern):
        os.kill(os.getpid(), signal.SIGKILL)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    """Hex digest of a file, read in blocks (weights and datasets can be GBs)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_json(target: str | os.PathLike, obj: Any) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=False, default=_json_default) + "\n")


def canonical_json(obj: Any) -> bytes:
    """``obj`` as the JSON text it reads back as, keys sorted and no spaces: what a digest of a JSON document is
    taken of (the same bytes before it is written and after it is read)."""
    plain = json.loads(json.dumps(obj, default=_json_default))
    return json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()


def write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_csv(target: str | os.PathLike, frame) -> None:
    """Write a pandas DataFrame atomically (no index)."""
    with atomic_path(target) as tmp:
        frame.to_csv(tmp, index=False)


def write_npz(target: str | os.PathLike, arrays: dict) -> None:
    import numpy as np

    with atomic_path(target) as tmp, open(tmp, "wb") as fh:  # a handle: np.savez renames bare paths
        np.savez_compressed(fh, **arrays)


def torch_bytes(obj: Any) -> bytes:
    """``torch.save`` into memory under a fixed record name: identical tensors give identical bytes
    (saving to a path stores that path's temp name inside the archive)."""
    import io as _io

    import torch

    buf = _io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_bytes(target: str | os.PathLike, data: bytes, what: str = "file") -> None:
    """Write ``data`` atomically; a full disk is reported as such, naming the folder, and leaves no temp file."""
    target = Path(target)
    try:
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
    except OSError as exc:
        full = disk_full_error(exc, target, what, len(data))
        if full is not None:
            raise full from exc
        raise


def disk_full_error(exc: OSError, target: Path, what: str, nbytes: int | None = None) -> OSError | None:
    """A full disk or quota (``exc``) reported naming the folder and the file being written; None otherwise."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        size = f" ({nbytes} bytes)" if nbytes is not None else ""
        return OSError(exc.errno, f"No space left on {target.parent} while writing the {what} {target.name}{size}: "
                                  "free space there and rerun")
    return None


def write_torch(target: str | os.PathLike, obj: Any, what: str = "file") -> str:
    """Save a torch object atomically with reproducible bytes; returns the file's sha256."""
    import hashlib

    data = torch_bytes(obj)
    write_bytes(target, data, what)
    return hashlib.sha256(data).hexdigest()


def remove_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete temp files that :func:`atomic_path` of a killed process left under ``folder``."""
    folder = Path(folder)
    removed = []
    for p in folder.rglob(".*.tmp*") if folder.is_dir() else []:
        if p.is_file() and ".tmp" in p.name:
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def save_figure(target: str | os.PathLike, fig) -> None:
    with atomic_path(target) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
