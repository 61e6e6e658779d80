"""Atomic server checkpoint after every completed round, and resume.

``<run_dir>/checkpoint/server.pt`` holds the round number, the global arrays, the
method's server state and the run hash. It is written to a temp file and renamed, so a
kill during the write leaves the previous round's checkpoint. The metric rows so far live
beside it in append-only JSON-lines files (:class:`RowsLog`): a round appends only its own rows,
and ``server.pt`` records how many bytes of each file (and their sha256) belong to it, so a
checkpoint costs the same in round 500 as in round 1 (a run evaluating 100 clients every round
has 50,000 client rows by then). Rows an interrupted round appended are cut off on resume.
The initial model theta_0 (server state ``_theta0``, for the data-free stopping rule) never
changes, so it is written once to ``theta0.pt``; ``server.pt`` records its sha256, checked on
resume. ``server.pt`` is written by ``state_file`` (safetensors' layout, its tensors' bytes written
without holding the GIL the next round's training needs; a payload it cannot describe goes through
``torch.save``), and read back by it, or by ``torch.load(weights_only=True)`` for a ``torch.save``
file: tensors and plain containers only, never arbitrary pickles. Client states live beside it (``checkpoint/clients``, see ``client_state``);
the checkpoint records which client state files round r needs and their sha256, and loading
checks them.

A completed run keeps its results, not its resume state: :func:`release` removes
``checkpoint/`` once every output is written (``keep_checkpoints: true`` keeps it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench.fl.api.arrays import host_tensors
from fedmedbench.fl.spec import RESUME_MODES
from fedmedbench.fl.state.client_state import RESTART_HINT, ClientStateStore, copy_state
from fedmedbench.fl.state.file_format import read_state, write_state
from fedmedbench.workflow.io import disk_full_error, remove_temp_files, write_bytes, write_torch


@dataclass
class RunState:
    round: int
    arrays: dict[str, torch.Tensor]
    server_state: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoint"


def client_store(run_dir: str | Path) -> ClientStateStore:
    return ClientStateStore(checkpoint_dir(run_dir) / "clients")


#: server-state entries that never change after round 0: written once to ``<name>.pt`` beside server.pt
WRITTEN_ONCE = ("_theta0",)


class BackgroundWriter:
    """Writes one checkpoint at a time in a background thread, so the disk write and fsync of round r
    overlap round r+1's training. ``submit`` waits for the previous write first (writes stay in round
    order, at most one pending) and ``wait`` re-raises a failed write (a full disk stops the run). The
    file is still written to a temp name and renamed: a kill mid-write leaves the previous checkpoint."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending = None

    def submit(self, fn, *args) -> None:
        self.wait()
        self._pending = self._pool.submit(fn, *args)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


#: the metric row lists of a RunState kept in the rows log, one JSON-lines file each
ROW_KINDS = ("rows", "client_rows")


class RowsLogError(RuntimeError):
    """A rows file the checkpoint needs is missing, shorter than recorded, changed or unreadable."""


class RowsLog:
    """A run's metric rows as append-only JSON-lines files (``checkpoint/rows.jsonl``,
    ``checkpoint/client_rows.jsonl``), so that each checkpoint writes only the rows added since
    the previous one. Floats are written by ``float.__repr__`` (they read back bit for bit; NaN as
    ``NaN``); NumPy scalars as their Python values.

    :meth:`take` (in the round, with the snapshot) picks the rows not yet handed to a checkpoint;
    :meth:`append` (in the checkpoint's write, possibly in its background thread, in round order)
    writes and fsyncs them and returns what ``server.pt`` records: per file the row count, the byte
    length and the sha256 of those bytes. Bytes beyond the recorded length (a round killed between
    its append and its ``server.pt``) are cut off by the next append. A log that has not written or
    read anything writes its files whole (temp file, then rename).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = checkpoint_dir(run_dir)
        self._taken = dict.fromkeys(ROW_KINDS, 0)  # rows handed to a checkpoint (the round's thread)
        self._bytes = dict.fromkeys(ROW_KINDS, 0)  # bytes that belong to the last appended checkpoint
        self._hash = {k: hashlib.sha256() for k in ROW_KINDS}
        self._fresh = True

    def path(self, kind: str) -> Path:
        return self.folder / f"{kind}.jsonl"

    def take(self, state: RunState) -> dict[str, Any]:
        """What :meth:`append` is to write: per kind (rows in ``state``, the rows no checkpoint had yet).
        A ``state`` with fewer rows than already taken (not a later round of the same run) writes the
        files again from its first row."""
        restart = any(len(getattr(state, k)) < self._taken[k] for k in ROW_KINDS)
        if restart:
            self._taken = dict.fromkeys(ROW_KINDS, 0)
        new: dict[str, Any] = {"restart": restart}
        for kind in ROW_KINDS:
            rows = getattr(state, kind)
            new[kind] = (len(rows), list(rows[self._taken[kind]:]))
            self._taken[kind] = len(rows)
        return new

    def append(self, new: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Write what :meth:`take` picked; returns the record ``server.pt`` keeps of each file."""
        if new["restart"]:
            self._fresh, self._bytes, self._hash = True, dict.fromkeys(ROW_KINDS, 0), {k: hashlib.sha256() for k in ROW_KINDS}
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {}
        for kind in ROW_KINDS:
            count, rows = new[kind]
            data = "".join(_row_line(row, kind) for row in rows).encode()
            path = self.path(kind)
            if self._fresh:  # the whole file at once (temp file, then rename)
                write_bytes(path, data, what="metric rows")
            else:
                _append(path, self._bytes[kind], data)
            self._bytes[kind] += len(data)
            self._hash[kind].update(data)
            record[kind] = {"count": count, "bytes": self._bytes[kind], "sha256": self._hash[kind].hexdigest()}
        self._fresh = False
        return record

    def read(self, record: dict[str, dict[str, Any]], checkpoint_round: int) -> dict[str, list[dict[str, Any]]]:
        """The rows a checkpoint recorded (checked against its byte length, sha256 and count); this log
        then continues after them."""
        out = {}
        for kind in ROW_KINDS:
            entry, path = record.get(kind), self.path(kind)
            if not isinstance(entry, dict) or not {"bytes", "sha256", "count"} <= set(entry):
                raise RowsLogError(f"{self.folder / 'server.pt'}: its record of {path.name} is incomplete "
                                   f"({entry!r}): {RESTART_HINT}")
            size = int(entry["bytes"])
            what = f"the checkpoint of round {checkpoint_round} needs its first {size} bytes"
            if not path.is_file():
                raise RowsLogError(f"{path}: missing; {what}: {RESTART_HINT}")
            with open(path, "rb") as fh:
                data = fh.read(size)
            if len(data) < size:
                raise RowsLogError(f"{path}: {len(data)} bytes, shorter than recorded; {what}: {RESTART_HINT}")
            digest = hashlib.sha256(data)
            if digest.hexdigest() != entry["sha256"]:
                raise RowsLogError(f"{path}: its sha256 differs from the one recorded ({what}; the file was changed "
                                   f"or damaged): {RESTART_HINT}")
            try:
                rows = [json.loads(line) for line in data.decode().splitlines()]
            except ValueError as exc:
                raise RowsLogError(f"{path}: not JSON lines ({exc}): {RESTART_HINT}") from exc
            if len(rows) != int(entry["count"]):
                raise RowsLogError(f"{path}: {len(rows)} rows where the checkpoint recorded {entry['count']}: {RESTART_HINT}")
            out[kind] = rows
            self._taken[kind], self._bytes[kind], self._hash[kind] = len(rows), size, digest
        self._fresh = False
        return out


def _append(path: Path, size: int, data: bytes) -> None:
    """``data`` written after the first ``size`` bytes of ``path`` (what follows them is cut off), then fsynced."""
    with open(path, "r+b") as fh:
        fh.truncate(size)
        fh.seek(size)
        try:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError as exc:
            full = disk_full_error(exc, path, "metric rows", len(data))
            if full is not None:
                raise full from exc
            raise


def _row_line(row: dict[str, Any], kind: str) -> str:
    return json.dumps(row, allow_nan=True, default=lambda value: _plain(value, kind)) + "\n"


def _plain(value: Any, kind: str) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a metric row ({kind}) holds {value!r} ({type(value).__name__}): rows take numbers, text, "
                    "booleans and None")


def save(run_dir: str | Path, state: RunState, run_hash: str, writer: BackgroundWriter | None = None,
         then=None, store: ClientStateStore | None = None, rows_log: RowsLog | None = None) -> Path:
    """Checkpoint ``state``: copied now (a consistent snapshot), then, now or by ``writer`` in the
    background, the client states ``store`` still holds are written, the rows added since the
    previous checkpoint are appended to ``rows_log`` (a new log: every row, in new files), the
    manifest of the client states this round needs is taken from the disk, and ``server.pt`` is
    serialised and written; ``then`` (e.g. pruning client states the checkpoint no longer needs)
    runs once it is on disk."""
    path = checkpoint_dir(run_dir) / "server.pt"
    store = client_store(run_dir) if store is None else store
    rows_log = RowsLog(run_dir) if rows_log is None else rows_log
    server_state = dict(state.server_state)
    for name in WRITTEN_ONCE:
        if name in server_state:
            server_state[f"{name}_sha256"] = _write_once(run_dir, name, server_state.pop(name), state.server_state)
    payload = {
        "run_hash": run_hash,
        "round": state.round,
        "arrays": host_tensors(state.arrays),
        "server_state": copy_state(server_state),  # the method may change its tensors in place next round
        "elapsed": state.elapsed,
    }
    unwritten = store.unwritten()
    # a round's rows are final when its checkpoint is taken; later rounds only add rows
    new_rows = rows_log.take(state)

    def write() -> None:
        store.write_unwritten(unwritten)
        payload["rows_log"] = rows_log.append(new_rows)
        # which client state files this round needs, with their sha256 (checked on resume)
        payload["client_states"] = store.manifest(state.round)
        write_state(path, payload, what="server checkpoint")  # the arrays' bytes written without the GIL
        if then is not None:
            then()

    if writer is None:
        write()
    else:
        writer.submit(write)
    return path


def _write_once(run_dir: str | Path, name: str, value: Any, server_state: dict[str, Any]) -> str:
    """``value`` written to ``<name>.pt`` the first time (its sha256 kept in ``server_state``); later calls
    only return the recorded sha256."""
    key = f"{name}_sha256"
    target = checkpoint_dir(run_dir) / f"{name.lstrip('_')}.pt"
    if server_state.get(key) is None or not target.is_file():
        server_state[key] = write_torch(target, value, what=f"server checkpoint part {name}")
    return server_state[key]


def _read_once(run_dir: str | Path, name: str, digest: str) -> Any:
    target = checkpoint_dir(run_dir) / f"{name.lstrip('_')}.pt"
    if not target.is_file():
        raise RuntimeError(f"{target}: missing (the server checkpoint needs it); {RESTART_HINT}")
    data = target.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise RuntimeError(f"{target}: its sha256 differs from the one the server checkpoint recorded; {RESTART_HINT}")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load(run_dir: str | Path, run_hash: str, rows_log: RowsLog | None = None) -> RunState | None:
    """The last completed round's state, or None (no checkpoint, or one from other settings).
    ``rows_log`` (the resumed run's) continues after the rows the checkpoint recorded."""
    path = checkpoint_dir(run_dir) / "server.pt"
    if not path.is_file():
        return None
    try:
        payload = read_state(path)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"{path}: unreadable checkpoint ({exc}); {RESTART_HINT}") from exc
    if payload.get("run_hash") != run_hash:
        return None
    if "client_states" in payload:  # absent in checkpoints written before the manifest existed
        client_store(run_dir).verify(payload["client_states"], int(payload["round"]))
    server_state = payload["server_state"]
    for name in WRITTEN_ONCE:
        if server_state.get(f"{name}_sha256") is not None:
            server_state[name] = _read_once(run_dir, name, server_state[f"{name}_sha256"])
    if "rows_log" in payload:
        rows = (RowsLog(run_dir) if rows_log is None else rows_log).read(payload["rows_log"], int(payload["round"]))
    else:  # a checkpoint written before the rows log kept its rows inside; the log starts afresh
        rows = {kind: payload[kind] for kind in ROW_KINDS}
    return RunState(
        round=int(payload["round"]),
        arrays=dict(payload["arrays"]),
        server_state=server_state,
        rows=rows["rows"],
        client_rows=rows["client_rows"],
        elapsed=float(payload["elapsed"]),
    )


def prepare(run_dir: str | Path, resume: str = "auto") -> None:
    """At job start: drop temp files a killed job left; ``resume="restart"`` also drops the checkpoint."""
    if resume not in RESUME_MODES:
        raise ValueError(f"resume = {resume!r}: choose {' or '.join(RESUME_MODES)}")
    remove_temp_files(run_dir)
    if resume == "restart":
        shutil.rmtree(checkpoint_dir(run_dir), ignore_errors=True)


def release(run_dir: str | Path, keep: bool = False) -> int:
    """After a completed run wrote every output: remove its resume state (unless ``keep``); bytes freed."""
    folder = checkpoint_dir(run_dir)
    if keep or not folder.exists():
        return 0
    freed = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    # the server checkpoint first: a kill half-way leaves no checkpoint pointing at deleted client states
    (folder / "server.pt").unlink(missing_ok=True)
    shutil.rmtree(folder)
    return freed
