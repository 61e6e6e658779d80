"""Client states: written when saved, or (server and clients in one process) held in memory until the
round's checkpoint writes them; either way a run and its checkpoints are the same."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from test_device_arrays import make_spec
from test_state_file import same_state

from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.state import checkpoint
from fedmedbench.fl.state.client_state import ClientStateError, ClientStateStore, copy_state, sha256_file
from fedmedbench.fl.state.file_format import read_state, write_state
from fedmedbench.workflow.io import write_torch


def test_a_deferred_save_holds_a_copy_until_the_checkpoint_writes_it(tmp_path):
    store = ClientStateStore(tmp_path, deferred=True)
    c = torch.ones(3)
    store.save(4, 1, {"c_i": {"w": c}, "k": 2})
    c.add_(1.0)  # the caller's tensor changes after saving (the resident model, trained by the next client)
    assert not (tmp_path / "00004").exists() and store.manifest(1) == {}
    got = store.load(4, before_round=2)
    assert torch.equal(got["c_i"]["w"], torch.ones(3)) and got["k"] == 2
    got["c_i"]["w"].add_(5.0)  # the loading client changes its copy in place
    assert torch.equal(store.load(4, before_round=2)["c_i"]["w"], torch.ones(3))
    assert store.load(4, before_round=1) == {}

    store.write_unwritten(store.unwritten())
    assert store.unwritten() == []
    path = tmp_path / "00004" / "r000001.pt"
    assert torch.equal(ClientStateStore(tmp_path).load(4, before_round=2)["c_i"]["w"], torch.ones(3))
    assert store.manifest(1) == {"4": {"round": 1, "sha256": sha256_file(path)}}


def test_load_takes_the_newest_state_of_memory_and_disk(tmp_path):
    store = ClientStateStore(tmp_path, deferred=True)
    store.save(0, 1, {"v": torch.tensor(1.0)})
    store.write_unwritten(store.unwritten())
    store.save(0, 3, {"v": torch.tensor(3.0)})
    assert float(store.load(0, before_round=4)["v"]) == 3.0  # held round 3 is newer than the file of round 1
    assert float(store.load(0, before_round=3)["v"]) == 1.0  # before round 3: the file


def test_a_state_saved_again_while_being_written_stays_held(tmp_path):
    store = ClientStateStore(tmp_path, deferred=True)
    store.save(0, 1, {"v": torch.tensor(1.0)})
    store.save(1, 1, {"v": torch.tensor(5.0)})
    entries = store.unwritten()
    assert [(pid, rnd) for pid, rnd, _ in entries] == [(0, 1), (1, 1)]
    store.save(0, 2, {"v": torch.tensor(2.0)})  # the next round's client, while the checkpoint writes round 1
    store.write_unwritten(entries)
    assert [(pid, rnd) for pid, rnd, _ in store.unwritten()] == [(0, 2)]
    assert sorted(p.name for p in (tmp_path / "00000").iterdir()) == ["r000001.pt", "r000001.pt.sha256"]
    (tmp_path / "00000" / "r000001.pt").unlink()
    store.write_unwritten(entries)  # the same entries again (a later checkpoint's list): already written, skipped
    assert not (tmp_path / "00000" / "r000001.pt").exists()


def test_discard_after_drops_held_states_of_later_rounds(tmp_path):
    store = ClientStateStore(tmp_path, deferred=True)
    store.save(0, 2, {"v": torch.tensor(2.0)})
    store.save(0, 3, {"v": torch.tensor(3.0)})
    store.discard_after(2)
    assert [(pid, rnd) for pid, rnd, _ in store.unwritten()] == [(0, 2)]


def _reads_by_thread(store: ClientStateStore, monkeypatch) -> list[tuple[int, str]]:
    """Record (pid, thread name) for every state the store reads."""
    import threading

    reads: list[tuple[int, str]] = []
    read = store._read

    def recorded(pid, before_round):
        reads.append((pid, threading.current_thread().name))
        return read(pid, before_round)

    monkeypatch.setattr(store, "_read", recorded)
    return reads


def test_prefetch_reads_the_next_clients_state_while_one_trains(tmp_path, monkeypatch):
    store = ClientStateStore(tmp_path, deferred=True)
    for pid in (0, 1, 2):
        store.save(pid, 1, {"v": torch.full((3,), float(pid)), "pid": pid})
    store.write_unwritten(store.unwritten()[:2])  # clients 0 and 1 on disk, 2 still held
    direct = {pid: ClientStateStore(tmp_path).load(pid, 2) for pid in (0, 1)}
    reads = _reads_by_thread(store, monkeypatch)
    store.prefetch([2, 0, 1, 5], before_round=2)
    for pid in (2, 0, 1):
        got = store.load(pid, before_round=2)
        same_state(got, direct[pid] if pid in direct else {"v": torch.full((3,), 2.0), "pid": 2})
        got["v"].add_(1.0)  # a client changes its copy: the store's is unchanged
    assert store.load(5, before_round=2) == {}  # a client without state
    assert [pid for pid, _ in reads] == [2, 0, 1, 5]
    assert {name.startswith("client-state-read") for _, name in reads} == {True}  # none on the round's path
    assert torch.equal(store.load(2, before_round=2)["v"], torch.full((3,), 2.0))  # not read ahead: read now


def test_prefetch_reads_one_ahead_drops_unused_reads_and_reports_a_damaged_file(tmp_path, monkeypatch):
    store = ClientStateStore(tmp_path, deferred=True)
    for pid in (0, 1, 2):
        store.save(pid, 1, {"v": torch.tensor(float(pid))})
    store.write_unwritten(store.unwritten())
    reads = _reads_by_thread(store, monkeypatch)
    store.prefetch([0, 1, 2], before_round=2)
    store._reader.submit(lambda: None).result()  # the read ahead has run
    assert [pid for pid, _ in reads] == [0]  # one state ahead, not the round's all
    store.prefetch([1, 2], before_round=3)  # client 0 never loaded: its read is dropped
    assert list(store._ahead) == [(1, 3)]
    (tmp_path / "00002" / "r000001.pt").write_bytes(b"garbled")
    assert float(store.load(1, before_round=3)["v"]) == 1.0  # and client 2's (damaged) read starts
    with pytest.raises(ClientStateError, match=r"00002/r000001\.pt: cannot load client state"):
        store.load(2, before_round=3)
    store.prefetch([0], before_round=4)
    store.stop_reading()  # the run is over: the thread ends, what it read is dropped
    assert store._reader is None and store._ahead == {}
    assert float(store.load(0, before_round=4)["v"]) == 0.0


def test_prefetch_is_off_where_states_are_written_at_once_or_absent(tmp_path):
    undeferred = ClientStateStore(tmp_path / "a")
    undeferred.save(0, 1, {"v": torch.tensor(1.0)})
    undeferred.prefetch([0], before_round=2)  # out of process (Ray, deployment): no read ahead
    stateless = ClientStateStore(tmp_path / "b", deferred=True)
    stateless.prefetch([0, 1], before_round=2)  # a method without client state
    assert undeferred._reader is None and stateless._reader is None
    assert float(undeferred.load(0, before_round=2)["v"]) == 1.0 and stateless.load(0, before_round=2) == {}


def test_an_undeferred_store_writes_at_once(tmp_path):
    store = ClientStateStore(tmp_path)
    store.save(2, 5, {"v": torch.tensor(1.0)})
    store.save(3, 5, {})  # nothing to keep: no file
    assert store.unwritten() == [] and (tmp_path / "00002" / "r000005.pt").is_file()
    assert not (tmp_path / "00003").exists()


def test_copy_state_is_what_loading_the_saved_file_gives(tmp_path):
    state = {"p": torch.nn.Parameter(torch.ones(2)), "g": torch.zeros(2, requires_grad=True),
             "d": torch.arange(3, dtype=torch.int64), "nested": [torch.ones(1), 3, (1.5, "x")], "s": "name"}
    write_torch(tmp_path / "s.pt", state)
    write_state(tmp_path / "store.pt", state)  # the store's own format
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    copied = copy_state(state)

    same_state(loaded, copied)
    same_state(read_state(tmp_path / "store.pt"), copied)
    assert copied["d"].data_ptr() != state["d"].data_ptr()


class _LaterWriter:
    """A checkpoint writer that runs the write only when told (a slow background thread)."""

    def __init__(self) -> None:
        self.jobs = []

    def submit(self, fn, *args) -> None:
        self.jobs.append((fn, args))

    def run(self) -> None:
        for fn, args in self.jobs:
            fn(*args)


def test_a_checkpoint_is_the_state_when_it_was_taken_not_when_it_is_written(tmp_path):
    store = ClientStateStore(checkpoint.checkpoint_dir(tmp_path) / "clients", deferred=True)
    momentum = torch.zeros(2)
    rows = [{"round": 1, "loss": 0.5}]
    state = checkpoint.RunState(round=1, arrays={"w": torch.ones(2)}, server_state={"m": momentum}, rows=rows)
    store.save(0, 1, {"c": torch.ones(2)})
    writer = _LaterWriter()
    checkpoint.save(tmp_path, state, "hash", writer, store=store)
    momentum.add_(7.0)  # the next round changes the server state in place and adds its row
    rows.append({"round": 2, "loss": 0.4})
    store.save(0, 2, {"c": torch.full((2,), 2.0)})
    assert not (checkpoint.checkpoint_dir(tmp_path) / "server.pt").exists()
    writer.run()
    resumed = checkpoint.load(tmp_path, "hash")
    assert resumed.round == 1 and torch.equal(resumed.server_state["m"], torch.zeros(2))
    assert resumed.rows == [{"round": 1, "loss": 0.5}]
    payload = read_state(checkpoint.checkpoint_dir(tmp_path) / "server.pt")
    assert list(payload["client_states"]) == ["0"] and payload["client_states"]["0"]["round"] == 1  # round 2 still held
    assert [(pid, rnd) for pid, rnd, _ in store.unwritten()] == [(0, 2)]


def _federation_run(spec) -> fed.Federation:
    """The run with clients called directly and their states written as they are saved."""
    federation = fed.Federation(spec, log=lambda m: None)
    assert not federation.store.deferred
    federation.stage_outputs(federation.run(fed.InProcessTransport(federation.job)))
    return federation


def test_an_inline_scaffold_run_equals_one_that_writes_each_state_at_once(blood_dir, monkeypatch):
    deferred = make_spec(blood_dir, "scaffold", "held", keep_checkpoints=True)
    at_once = make_spec(blood_dir, "scaffold", "direct", keep_checkpoints=True)
    threads: list[str] = []
    read = ClientStateStore._read

    def recorded(self, pid, before_round):
        import threading

        state = read(self, pid, before_round)
        if state:  # a read that found a state (round 1's clients have none yet)
            threads.append(threading.current_thread().name)
        return state

    monkeypatch.setattr(ClientStateStore, "_read", recorded)
    logs: list[str] = []
    federation = engine.run(deferred, log=logs.append)
    assert federation.store.deferred and federation.store._reader is None  # its read-ahead thread ended with the run
    # the inline run read its clients' states ahead, in the background
    assert threads and {t.startswith("client-state-read") for t in threads} == {True}
    threads.clear()
    _federation_run(at_once)
    assert threads and {t.startswith("client-state-read") for t in threads} == {False}  # read as loaded
    a = torch.load(Path(deferred.run_dir) / "model.pt", weights_only=True)
    b = torch.load(Path(at_once.run_dir) / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    pd.testing.assert_frame_equal(pd.read_csv(Path(deferred.run_dir) / "metrics.csv").drop(columns="elapsed_s"),
                                  pd.read_csv(Path(at_once.run_dir) / "metrics.csv").drop(columns="elapsed_s"))
    # the same client state files, byte for byte, named by the last checkpoint
    clients = [checkpoint.checkpoint_dir(s.run_dir) / "clients" for s in (deferred, at_once)]
    files = [sorted(p.relative_to(c) for p in c.rglob("*.pt")) for c in clients]
    assert files[0] == files[1] and files[0]
    for rel in files[0]:
        assert (clients[0] / rel).read_bytes() == (clients[1] / rel).read_bytes(), rel
    manifest = read_state(checkpoint.checkpoint_dir(deferred.run_dir) / "server.pt")["client_states"]
    assert {f"{int(rel.parts[0])}" for rel in files[0]} == set(manifest)
