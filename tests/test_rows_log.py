"""The metric rows of a checkpoint live in append-only JSON-lines files (checkpoint.RowsLog): each
checkpoint writes only its round's rows, they read back bit for bit, and a resumed run sees exactly
the rows its checkpoint recorded."""

from __future__ import annotations

import errno
import math
import os
import struct

import numpy as np
import pytest
import torch

from fedmedbench.fl.api.arrays import model_arrays
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.state.file_format import read_state, write_state
from fedmedbench.workflow.io import torch_bytes, write_bytes

ARRAYS = model_arrays(torch.nn.Linear(3, 2))


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _state(rnd: int, rows: list, client_rows: list | None = None) -> checkpoint.RunState:
    return checkpoint.RunState(round=rnd, arrays=ARRAYS, rows=rows, client_rows=client_rows or [])


def _rows(upto: int, clients: int = 3) -> tuple[list, list]:
    rows = [{"round": r, "train_loss": 1 / (r + 2), "datafree_stop": 0} for r in range(1, upto + 1)]
    client_rows = [{"round": r, "client": c, "local_accuracy": (r * 7 + c) / 9} for r in range(1, upto + 1)
                   for c in range(clients)]
    return rows, client_rows


def test_rows_read_back_bit_for_bit(tmp_path):
    floats = [0.1, 1 / 3, 2.0**-1074, 1e308, -0.0, math.inf, -math.inf, np.float64(0.7), np.float32(0.1)]
    row = {"round": 1, "n": np.int64(12), "stop": np.bool_(True), "flag": False, "note": "é", "none": None,
           **{f"f{i}": v for i, v in enumerate(floats)}, "nan": math.nan}
    checkpoint.save(tmp_path, _state(1, [row], [{"round": 1, "client": 0, "local_loss": np.float64(2 / 3)}]), "h")
    back = checkpoint.load(tmp_path, "h")
    got = back.rows[0]
    for i, v in enumerate(floats):
        assert _bits(got[f"f{i}"]) == _bits(float(v)), (i, v, got[f"f{i}"])
    assert math.isnan(got["nan"])
    assert (got["n"], got["stop"], got["flag"], got["note"], got["none"]) == (12, True, False, "é", None)
    assert type(got["n"]) is int and type(got["stop"]) is bool
    assert _bits(back.client_rows[0]["local_loss"]) == _bits(2 / 3)


def test_each_checkpoint_writes_only_its_rounds_rows(tmp_path, monkeypatch):
    written = []
    real = checkpoint._row_line
    monkeypatch.setattr(checkpoint, "_row_line", lambda row, kind: written.append((kind, row["round"])) or real(row, kind))
    log = checkpoint.RowsLog(tmp_path)
    server = checkpoint.checkpoint_dir(tmp_path) / "server.pt"
    sizes = []
    for rnd in (1, 2, 3, 40):
        written.clear()
        rows, client_rows = _rows(rnd, clients=100)
        checkpoint.save(tmp_path, _state(rnd, rows, client_rows), "h", rows_log=log)
        sizes.append(server.stat().st_size)
        new = range(1 if rnd == 1 else {2: 2, 3: 3, 40: 4}[rnd], rnd + 1)  # the rounds since the last checkpoint
        assert written == [("rows", r) for r in new] + [("client_rows", r) for r in new for _ in range(100)]
    # server.pt no longer grows with the rows (4,000 client rows by the last save)
    assert max(sizes) - min(sizes) < 64, sizes
    lines = (checkpoint.checkpoint_dir(tmp_path) / "client_rows.jsonl").read_text().splitlines()
    assert len(lines) == 4000
    resumed = checkpoint.load(tmp_path, "h")
    assert (resumed.rows, resumed.client_rows) == _rows(40, clients=100)


def test_rows_of_a_round_killed_before_its_server_checkpoint_are_cut_off(tmp_path):
    log = checkpoint.RowsLog(tmp_path)
    checkpoint.save(tmp_path, _state(1, *_rows(1)), "h", rows_log=log)
    # round 2 appended its rows, then the process died before server.pt was replaced
    log.append(log.take(_state(2, *_rows(2))))
    path = log.path("client_rows")
    assert len(path.read_text().splitlines()) == 6
    # the resumed process: the checkpoint of round 1 and its rows only
    resumed_log = checkpoint.RowsLog(tmp_path)
    resumed = checkpoint.load(tmp_path, "h", resumed_log)
    assert resumed.round == 1 and (resumed.rows, resumed.client_rows) == _rows(1)
    # round 2 again (other values this time): its rows replace the stray ones, nothing is doubled
    rows, client_rows = _rows(2)
    rows[1]["train_loss"] = 9.0
    checkpoint.save(tmp_path, _state(2, rows, client_rows), "h", rows_log=resumed_log)
    again = checkpoint.load(tmp_path, "h")
    assert again.rows == rows and again.client_rows == client_rows
    assert len(path.read_text().splitlines()) == 6


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.unlink(), "missing"),
    (lambda p: p.write_bytes(p.read_bytes()[:-5]), "shorter than recorded"),
    (lambda p: p.write_bytes(p.read_bytes().replace(b'"round": 1', b'"round": 7')), "sha256 differs"),
])
def test_a_damaged_rows_file_is_named(tmp_path, damage, message):
    checkpoint.save(tmp_path, _state(2, *_rows(2)), "h")
    path = checkpoint.checkpoint_dir(tmp_path) / "rows.jsonl"
    damage(path)
    with pytest.raises(checkpoint.RowsLogError, match=rf"{path}: .*{message}.*restart the run"):
        checkpoint.load(tmp_path, "h")


def test_a_checkpoint_that_kept_its_rows_inside_still_resumes(tmp_path):
    """Checkpoints written before the rows log held the rows in server.pt; the log then starts afresh."""
    rows, client_rows = _rows(2)
    payload = {"run_hash": "h", "round": 2, "arrays": {k: v.clone() for k, v in ARRAYS.items()},
               "server_state": {}, "rows": rows, "client_rows": client_rows, "elapsed": 1.5, "client_states": {}}
    write_bytes(checkpoint.checkpoint_dir(tmp_path) / "server.pt", torch_bytes(payload))
    log = checkpoint.RowsLog(tmp_path)
    resumed = checkpoint.load(tmp_path, "h", log)
    assert (resumed.rows, resumed.client_rows) == (rows, client_rows)
    more_rows, more_client_rows = _rows(3)
    checkpoint.save(tmp_path, _state(3, more_rows, more_client_rows), "h", rows_log=log)
    assert checkpoint.load(tmp_path, "h").client_rows == more_client_rows


def test_a_row_value_that_is_no_plain_value_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"metric row \(rows\) holds tensor"):
        checkpoint.save(tmp_path, _state(1, [{"round": 1, "loss": torch.tensor(0.5)}]), "h")


def test_disk_full_while_appending_rows_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    log = checkpoint.RowsLog(tmp_path)
    checkpoint.save(tmp_path, _state(1, *_rows(1)), "h", rows_log=log)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.os, "fsync", full)  # the rows were written, then the disk is full
    folder = checkpoint.checkpoint_dir(tmp_path)
    with pytest.raises(OSError, match=rf"No space left on {folder} while writing the metric rows rows.jsonl"):
        checkpoint.save(tmp_path, _state(2, *_rows(2)), "h", rows_log=log)
    monkeypatch.undo()
    resumed = checkpoint.load(tmp_path, "h")
    assert resumed.round == 1 and (resumed.rows, resumed.client_rows) == _rows(1)


def test_a_state_with_fewer_rows_writes_the_files_again(tmp_path):
    """A log handed an earlier state than its last (not a later round of the same run) starts over."""
    log = checkpoint.RowsLog(tmp_path)
    checkpoint.save(tmp_path, _state(3, *_rows(3)), "h", rows_log=log)
    checkpoint.save(tmp_path, _state(1, *_rows(1)), "h", rows_log=log)
    assert (checkpoint.load(tmp_path, "h").rows, checkpoint.load(tmp_path, "h").client_rows) == _rows(1)
    checkpoint.save(tmp_path, _state(2, *_rows(2)), "h", rows_log=log)
    assert checkpoint.load(tmp_path, "h").client_rows == _rows(2)[1]


def test_a_server_checkpoint_with_an_incomplete_rows_record_is_named(tmp_path):
    checkpoint.save(tmp_path, _state(1, *_rows(1)), "h")
    server = checkpoint.checkpoint_dir(tmp_path) / "server.pt"
    payload = read_state(server)
    del payload["rows_log"]["client_rows"]["sha256"]
    write_state(server, payload)
    with pytest.raises(checkpoint.RowsLogError, match=r"server\.pt: its record of client_rows\.jsonl is incomplete"):
        checkpoint.load(tmp_path, "h")
