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

Where server and clients share one process (the inline backend), the store is *deferred*:
``save`` keeps a copy of the state in memory and the server checkpoint writes every unwritten
state (file and sidecar, as above) before it writes ``server.pt`` and its manifest, in the
checkpoint's background thread. A client sampled again before that write reads the copy in
memory. What reaches the disk, and when a checkpoint may name it, is unchanged; a ConvNeXtV2-nano
sized state (60 MB) no longer costs a serialisation, a hash and an fsync on the round's
critical path. States that were never
written belong to a round without a checkpoint, which a resumed run discards anyway.

A deferred store also reads ahead (:meth:`ClientStateStore.prefetch`): given the round's clients in
the order they train, it reads the next client's state in a background thread while the current
one trains, so a file read (about 30 ms for 60 MB) is off the round's path too. One state at most
is read ahead; what :meth:`~ClientStateStore.load` returns is the same either way.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fedmedbench.fl.api.arrays import snapshot
from fedmedbench.fl.state.file_format import read_state, write_state
from fedmedbench.workflow import io
from fedmedbench.workflow.io import write_bytes

_NAME = re.compile(r"^r(\d{6})\.pt$")
#: what to do when a client state is missing or damaged (the run cannot continue bit-identically)
RESTART_HINT = ("restart the run: delete its checkpoint/ folder, or rerun with `--config resume=restart` "
                "(it starts again from round 0)")


class ClientStateError(RuntimeError):
    """A client state a resumed run needs is missing, different from the one recorded, or unreadable."""


def sha256_file(path: Path) -> str:
    return io.file_digest(path, "sha256")


class ClientStateStore:
    def __init__(self, root: str | Path, deferred: bool = False) -> None:
        self.root = Path(root)
        #: keep saved states in memory until :meth:`write_unwritten` (the server checkpoint) writes them
        self.deferred = deferred
        self._unwritten: dict[int, dict[int, dict[str, Any]]] = {}  # pid -> round -> state
        self._lock = threading.Lock()
        #: read ahead: the round's clients in training order, and the reads under way, by (pid, before_round)
        self._queue: tuple[list[int], int] = ([], 0)
        self._ahead: dict[tuple[int, int], Future] = {}
        self._reader: ThreadPoolExecutor | None = None

    def _dir(self, pid: int) -> Path:
        return self.root / f"{int(pid):05d}"

    def _versions(self, pid: int) -> list[tuple[int, Path]]:
        d = self._dir(pid)
        if not d.is_dir():
            return []
        out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
        return sorted(out)

    def load(self, pid: int, before_round: int) -> dict[str, Any]:
        """Newest state saved in a round < ``before_round`` (empty dict if none); a copy the caller may change."""
        key = (int(pid), int(before_round))
        with self._lock:
            ahead = self._ahead.pop(key, None)
        self._read_next_after(*key)
        return ahead.result() if ahead is not None else self._read(*key)

    def prefetch(self, pids: list[int], before_round: int) -> None:
        """The round's clients, in the order they will ``load``: the first one's state is read now in
        the background, and each ``load`` starts reading the next one's. Reads not used are dropped."""
        if not self.deferred:
            return
        with self._lock:
            self._queue = ([int(p) for p in pids], int(before_round))
            self._ahead.clear()
        if pids:
            self._read_ahead(int(pids[0]), int(before_round))

    def stop_reading(self) -> None:
        """End the read-ahead thread (the run is over); reads not used are dropped."""
        with self._lock:
            self._queue, reader, self._reader = ([], 0), self._reader, None
            self._ahead.clear()
        if reader is not None:
            reader.shutdown(wait=True, cancel_futures=True)

    def _read_next_after(self, pid: int, before_round: int) -> None:
        pids, rnd = self._queue
        if rnd == before_round and pid in pids and pids.index(pid) + 1 < len(pids):
            self._read_ahead(pids[pids.index(pid) + 1], rnd)

    def _read_ahead(self, pid: int, before_round: int) -> None:
        if not (self.root.is_dir() or self._unwritten):  # a method without client state: nothing to read
            return
        if self._reader is None:
            self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="client-state-read")
        with self._lock:
            if (pid, before_round) not in self._ahead:
                self._ahead[(pid, before_round)] = self._reader.submit(self._read, pid, before_round)

    def _read(self, pid: int, before_round: int) -> dict[str, Any]:
        with self._lock:
            held = {r: st for r, st in self._unwritten.get(int(pid), {}).items() if r < before_round}
        versions = [(r, p) for r, p in self._versions(pid) if r < before_round]
        if held and (not versions or max(held) >= versions[-1][0]):
            return copy_state(held[max(held)])
        if not versions:
            return {}
        path = versions[-1][1]
        try:
            return read_state(path)
        except Exception as exc:  # noqa: BLE001 - name the file
            # torch's own text suggests weights_only=False, which is never the fix here: keep it to the chained error
            raise ClientStateError(f"{path}: cannot load client state ({type(exc).__name__}: not a readable tensor "
                                   f"archive); the file is damaged: {RESTART_HINT}") from exc

    def save(self, pid: int, rnd: int, state: dict[str, Any]) -> None:
        """Client ``pid``'s state after round ``rnd``: written now, or (deferred) copied and held until
        the round's checkpoint writes it."""
        if not state:
            return
        if self.deferred:
            held = copy_state(state)  # the caller's tensors may be the resident model's, changed by the next client
            with self._lock:
                self._unwritten.setdefault(int(pid), {})[int(rnd)] = held
            return
        self._write(int(pid), int(rnd), state)

    def _write(self, pid: int, rnd: int, state: dict[str, Any]) -> None:
        path = self._dir(pid) / f"r{rnd:06d}.pt"
        digest = write_state(path, state, what="client state")
        write_bytes(_sidecar(path), (digest + "\n").encode(), what="client state hash")

    def unwritten(self) -> list[tuple[int, int, dict[str, Any]]]:
        """The held states as (pid, round, state), in order: what the next checkpoint must write first."""
        with self._lock:
            return [(pid, rnd, st) for pid, by_round in sorted(self._unwritten.items()) for rnd, st in sorted(by_round.items())]

    def write_unwritten(self, entries: list[tuple[int, int, dict[str, Any]]]) -> None:
        """Write ``entries`` (from :meth:`unwritten`) to disk, then stop holding them (a state saved again
        meanwhile stays held). An entry an earlier checkpoint wrote meanwhile is skipped. Safe in a
        background thread while clients load and save."""
        for pid, rnd, state in entries:
            with self._lock:
                if self._unwritten.get(pid, {}).get(rnd) is not state:
                    continue
            self._write(pid, rnd, state)
            with self._lock:
                by_round = self._unwritten.get(pid, {})
                if by_round.get(rnd) is state:
                    del by_round[rnd]
                    if not by_round:
                        del self._unwritten[pid]

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
        """Remove states saved by rounds > ``rnd`` (they belong to an interrupted round)."""
        with self._lock:
            for by_round in self._unwritten.values():
                for r in [r for r in by_round if r > rnd]:
                    del by_round[r]
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


def copy_state(obj: Any) -> Any:
    """A deep copy of a client state as reading its file (:func:`read_state`) returns it: tensors detached on the
    CPU, containers rebuilt, plain values as they are. Plain tensors (no Parameters, no gradients) are copied
    per (device, dtype) by one transfer (:func:`~fedmedbench.fl.api.arrays.snapshot`), not one per tensor: a
    state of model-sized vectors is 160 tensors for ConvNeXtV2-nano, each a synchronising copy from a GPU."""
    plain: list[torch.Tensor] = []
    _plain_tensors(obj, plain)
    copies = snapshot(dict(enumerate(plain)), "cpu") if plain else {}
    return _rebuilt(obj, iter(copies.values()))


def _is_plain(t: torch.Tensor) -> bool:
    return not isinstance(t, torch.nn.Parameter) and not t.requires_grad


def _plain_tensors(obj: Any, found: list[torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        if _is_plain(obj):
            found.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _plain_tensors(v, found)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _plain_tensors(v, found)


def _rebuilt(obj: Any, copies: Iterator[torch.Tensor]) -> Any:
    """``obj`` with its plain tensors replaced by ``copies`` (in :func:`_plain_tensors`' order)."""
    if isinstance(obj, torch.Tensor):
        if _is_plain(obj):
            return next(copies)
        out = obj.detach().to("cpu", copy=True)
        if isinstance(obj, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=obj.requires_grad)
        return out.requires_grad_(obj.requires_grad)
    if isinstance(obj, dict):
        return {k: _rebuilt(v, copies) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_rebuilt(v, copies) for v in obj)
    return copy.deepcopy(obj)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
