"""Atomic server checkpoint after every completed round, and resume.

``<run_dir>/checkpoint/server.pt`` holds the round number, the global arrays, the
method's server state, the metric rows so far and the run hash. It is written to a
temp file and renamed, so a kill during the write leaves the previous round's
checkpoint. The initial model theta_0 (server state ``_theta0``, for the data-free stopping
rule) never changes, so it is written once to ``theta0.pt``; ``server.pt`` records its sha256,
checked on resume. Loading uses ``torch.load(weights_only=True)``: tensors and plain
containers only, never arbitrary pickles. Client states live beside it
(``checkpoint/clients``, see ``client_state``); the checkpoint records which client
state files round r needs and their sha256, and loading checks them.

A completed run keeps its results, not its resume state: :func:`release` removes
``checkpoint/`` once every output is written (``keep_checkpoints: true`` keeps it).
"""

from __future__ import annotations

import hashlib
import io
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench.fl.client_state import RESTART_HINT, ClientStateStore, copy_state
from fedmedbench.fl.registry import arrays_to_tensors
from fedmedbench.io import remove_temp_files, torch_bytes, write_bytes, write_torch


@dataclass
class RunState:
    round: int
    arrays: dict[str, np.ndarray]
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


def save(run_dir: str | Path, state: RunState, run_hash: str, writer: BackgroundWriter | None = None,
         then=None, store: ClientStateStore | None = None) -> Path:
    """Checkpoint ``state``: copied now (a consistent snapshot), then, now or by ``writer`` in the
    background, the client states ``store`` still holds are written, the manifest of the client
    states this round needs is taken from the disk, and ``server.pt`` is serialised and written;
    ``then`` (e.g. pruning client states the checkpoint no longer needs) runs once it is on disk."""
    path = checkpoint_dir(run_dir) / "server.pt"
    store = client_store(run_dir) if store is None else store
    server_state = dict(state.server_state)
    for name in WRITTEN_ONCE:
        if name in server_state:
            server_state[f"{name}_sha256"] = _write_once(run_dir, name, server_state.pop(name), state.server_state)
    payload = {
        "run_hash": run_hash,
        "round": state.round,
        "arrays": arrays_to_tensors(state.arrays),
        "server_state": copy_state(server_state),  # the method may change its tensors in place next round
        # a round's rows are final when its checkpoint is taken; later rounds only add rows
        "rows": list(state.rows),
        "client_rows": list(state.client_rows),
        "elapsed": state.elapsed,
    }
    unwritten = store.unwritten()

    def write() -> None:
        store.write_unwritten(unwritten)
        # which client state files this round needs, with their sha256 (checked on resume)
        payload["client_states"] = store.manifest(state.round)
        write_bytes(path, torch_bytes(payload), what="server checkpoint")
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


def load(run_dir: str | Path, run_hash: str) -> RunState | None:
    """The last completed round's state, or None (no checkpoint, or one from other settings)."""
    path = checkpoint_dir(run_dir) / "server.pt"
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
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
    return RunState(
        round=int(payload["round"]),
        arrays={k: v.numpy() for k, v in payload["arrays"].items()},
        server_state=server_state,
        rows=payload["rows"],
        client_rows=payload["client_rows"],
        elapsed=float(payload["elapsed"]),
    )


def prepare(run_dir: str | Path, resume: str = "auto") -> None:
    """At job start: drop temp files a killed job left; ``resume="restart"`` also drops the checkpoint."""
    if resume not in ("auto", "restart"):
        raise ValueError(f"resume = {resume!r}: choose auto or restart")
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
