"""The one supported home for client state that persists across rounds.

Client state (control variates, dual variables, personalised layers, a local
model) lives on the client's disk, not in RAM and not on the server: a client loads
it when it is sampled and saves it after training. Files are versioned by round
(``clients/<pid>/r<round>.pt``, written atomically) so that a run resumed from the
server checkpoint of round r sees exactly the client states of rounds <= r: newer
files (written by a round that was interrupted) are discarded on resume.

The same store serves Flower's ``context.state`` purpose in simulation and survives
a killed job, which ``context.state`` does not.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from fedmedbench.io import atomic_path

_NAME = re.compile(r"^r(\d{6})\.pt$")


class ClientStateStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _dir(self, pid: int) -> Path:
        return self.root / f"{int(pid):05d}"

    def _versions(self, pid: int) -> list[tuple[int, Path]]:
        d = self._dir(pid)
        if not d.is_dir():
            return []
        out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
        return sorted(out)

    def load(self, pid: int, before_round: int) -> dict[str, Any]:
        """Newest state saved in a round < ``before_round`` (empty dict if none)."""
        versions = [(r, p) for r, p in self._versions(pid) if r < before_round]
        if not versions:
            return {}
        path = versions[-1][1]
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - name the file
            raise RuntimeError(f"{path}: cannot load client state ({exc})") from exc

    def save(self, pid: int, rnd: int, state: dict[str, Any]) -> None:
        if not state:
            return
        with atomic_path(self._dir(pid) / f"r{rnd:06d}.pt") as tmp:
            torch.save(state, tmp)

    def discard_after(self, rnd: int) -> None:
        """Remove states written by rounds > ``rnd`` (they belong to an interrupted round)."""
        for d in self.root.glob("*") if self.root.is_dir() else []:
            for r, p in self._versions(int(d.name)) if d.name.isdigit() else []:
                if r > rnd:
                    p.unlink(missing_ok=True)

    def prune(self, upto_round: int) -> None:
        """Keep only each client's newest state among rounds <= ``upto_round``."""
        for d in self.root.glob("*") if self.root.is_dir() else []:
            if not d.name.isdigit():
                continue
            committed = [(r, p) for r, p in self._versions(int(d.name)) if r <= upto_round]
            for _, p in committed[:-1]:
                p.unlink(missing_ok=True)
