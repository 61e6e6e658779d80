"""Atomic server checkpoint after every completed round, and resume.

``<run_dir>/checkpoint/server.pt`` holds the round number, the global arrays, the
method's server state, the metric rows so far and the run hash. It is written to a
temp file and renamed, so a kill during the write leaves the previous round's
checkpoint. Loading uses ``torch.load(weights_only=True)``: tensors and plain
containers only, never arbitrary pickles. Client states live beside it
(``checkpoint/clients``, see ``client_state``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedmedbench.fl.registry import arrays_to_tensors
from fedmedbench.io import atomic_path


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
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def load(run_dir: str | Path, run_hash: str) -> RunState | None:
    """The last completed round's state, or None (no checkpoint, or one from other settings)."""
    path = checkpoint_dir(run_dir) / "server.pt"
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"{path}: unreadable checkpoint ({exc}); delete it to start the run afresh") from exc
    if payload.get("run_hash") != run_hash:
        return None
    return RunState(
        round=int(payload["round"]),
        arrays={k: v.numpy() for k, v in payload["arrays"].items()},
        server_state=payload["server_state"],
        rows=payload["rows"],
        client_rows=payload["client_rows"],
        elapsed=float(payload["elapsed"]),
    )
