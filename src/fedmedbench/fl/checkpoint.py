"""Atomic server checkpoint after every completed round, and resume.

``<run_dir>/checkpoint/server.pt`` holds the round number, the global arrays, the
method's server state, the metric rows so far and the run hash. It is written to a
temp file and renamed, so a kill during the write leaves the previous round's
checkpoint. Loading uses ``torch.load(weights_only=True)``: tensors and plain
containers only, never arbitrary pickles. Client states live beside it
(``checkpoint/clients``, see ``client_state``); the checkpoint records which client
state files round r needs and their sha256, and loading checks them.

A completed run keeps its results, not its resume state: :func:`release` removes
``checkpoint/`` once every output is written (``keep_checkpoints: true`` keeps it).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench.fl.client_state import RESTART_HINT, ClientStateStore
from fedmedbench.fl.registry import arrays_to_tensors
from fedmedbench.io import remove_temp_files, write_torch


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


def save(run_dir: str | Path, state: RunState, run_hash: str) -> Path:
    path = checkpoint_dir(run_dir) / "server.pt"
    payload = {
        "run_hash": run_hash,
        "round": state.round,
        "arrays": arrays_to_tensors(state.arrays),
        "server_state": state.server_state,
        "rows": state.rows,
        "client_rows": state.client_rows,
        "elapsed": state.elapsed,
        # which client state files this round needs, with their sha256 (checked on resume)
        "client_states": client_store(run_dir).manifest(state.round),
    }
    write_torch(path, payload, what="server checkpoint")
    return path


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
    return RunState(
        round=int(payload["round"]),
        arrays={k: v.numpy() for k, v in payload["arrays"].items()},
        server_state=payload["server_state"],
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
