"""The one supported home for client state that persists across rounds.

Client state (control variates, dual variables, personalised layers, a local
model) lives on the client's disk, not in RAM and not on the server: a client loads
it when it is sampled and saves it after training. Files are versioned by round
(``clients/<pid>/r<round>.pt``, written atomically) so that a run resumed from the
server checkpoint of round r sees exactly the client states of rounds <= r: newer
files (written by a round that was interrupted) are discarded on resume.

Each file has a ``.sha256`` sidecar (the hash of the bytes written). The server
checkpoint of round r records, per client, which round's file it needs and that
hash (:meth:`ClientStateStore.manifest`); resuming checks every one of them
(:meth:`ClientStateStore.verify`), so a missing, replaced or corrupt client state is
a clear error, never a silently different run.

The same store serves Flower's ``context.state`` purpose in simulation and survives
a killed job, which ``context.state`` does not.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import torch

from fedmedbench.io import write_bytes, write_torch

_NAME = re.compile(r"^r(\d{6})\.pt$")
#: what to do when a client state is missing or damaged (the run cannot continue bit-identically)
RESTART_HINT = ("restart the run: delete its checkpoint/ folder, or rerun with `--config resume=restart` "
                "(it starts again from round 0)")


class ClientStateError(RuntimeError):
    """A client state a resumed run needs is missing, different from the one recorded, or unreadable."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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
            # torch's own text suggests weights_only=False, which is never the fix here: keep it to the chained error
            raise ClientStateError(f"{path}: cannot load client state ({type(exc).__name__}: not a readable tensor "
                                   f"archive); the file is damaged: {RESTART_HINT}") from exc

    def save(self, pid: int, rnd: int, state: dict[str, Any]) -> None:
        if not state:
            return
        path = self._dir(pid) / f"r{rnd:06d}.pt"
        digest = write_torch(path, state, what="client state")
        write_bytes(_sidecar(path), (digest + "\n").encode(), what="client state hash")

    def manifest(self, upto_round: int) -> dict[str, dict[str, Any]]:
        """Per client (partition id as text): the round and sha256 of the state a run at ``upto_round`` uses."""
        out = {}
        for d in sorted(self.root.glob("*")) if self.root.is_dir() else []:
            if not d.name.isdigit():
                continue
            committed = [(r, p) for r, p in self._versions(int(d.name)) if r <= upto_round]
            if committed:
                rnd, path = committed[-1]
                side = _sidecar(path)
                digest = side.read_text().strip() if side.is_file() else sha256_file(path)
                out[str(int(d.name))] = {"round": rnd, "sha256": digest}
        return out

    def verify(self, manifest: dict[str, dict[str, Any]], checkpoint_round: int) -> None:
        """Every client state the checkpoint of ``checkpoint_round`` recorded is present and unchanged."""
        for pid, entry in sorted(manifest.items(), key=lambda kv: int(kv[0])):
            path = self._dir(int(pid)) / f"r{int(entry['round']):06d}.pt"
            if not path.is_file():
                raise ClientStateError(
                    f"{path}: missing; the checkpoint of round {checkpoint_round} needs client {pid}'s state from "
                    f"round {entry['round']} to resume bit-identically: {RESTART_HINT}")
            actual = sha256_file(path)
            if actual != entry["sha256"]:
                raise ClientStateError(
                    f"{path}: sha256 {actual[:12]}... differs from the {entry['sha256'][:12]}... recorded by the "
                    f"checkpoint of round {checkpoint_round} (the file was replaced or damaged): {RESTART_HINT}")

    def discard_after(self, rnd: int) -> None:
        """Remove states written by rounds > ``rnd`` (they belong to an interrupted round)."""
        for d in self.root.glob("*") if self.root.is_dir() else []:
            for r, p in self._versions(int(d.name)) if d.name.isdigit() else []:
                if r > rnd:
                    p.unlink(missing_ok=True)
                    _sidecar(p).unlink(missing_ok=True)

    def prune(self, upto_round: int) -> None:
        """Keep only each client's newest state among rounds <= ``upto_round``."""
        for d in self.root.glob("*") if self.root.is_dir() else []:
            if not d.name.isdigit():
                continue
            committed = [(r, p) for r, p in self._versions(int(d.name)) if r <= upto_round]
            for _, p in committed[:-1]:
                p.unlink(missing_ok=True)
                _sidecar(p).unlink(missing_ok=True)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
