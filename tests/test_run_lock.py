"""The run lock (workflow/runlock.py) against a second process: a full disk at its write names the folder; the lock
is read without being taken; a refused job keeps the running job's log; and a second snakemake (after --unlock, or
with --nolock) runs no job of a run another process trains, so the first ends with its outputs and its log."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, copy_workflow

from fedmedbench.workflow import runlock
from fedmedbench.workflow.runlock import LOCK_NAME, LOG_LINK, holder_of, run_lock

#: a process that holds a run's lock as a training job does (its log opened by log_to), until its stdin closes
HOLDER = """
import os, sys
from fedmedbench.workflow.runlog import log_to
from fedmedbench.workflow.runlock import run_lock

run_dir, log = sys.argv[1:]
parent = os.dup(1)  # log_to sends fd 1 to the log
with log_to(log) as say:
    say("first job: round 1")
    with run_lock(run_dir, log=log):
        os.write(parent, b"held\\n")
        sys.stdin.readline()
        say("first job: round 2")
"""


def _holder(run_dir: Path, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), str(log)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.stdout.readline().strip() == "held"
    return proc


def _release(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_a_full_disk_at_the_run_locks_write_names_the_folder(tmp_path, monkeypatch):
    def no_space(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    run_dir = tmp_path / "results" / "run"
    monkeypatch.setattr(runlock.os, "pwrite", no_space)
    with pytest.raises(OSError, match=rf"^\[Errno 28\] No space left on {re.escape(str(run_dir))} while writing the "
                                      r"run lock \.run\.lock: free space there and rerun$"):
        with run_lock(run_dir):
            pass
    assert not (run_dir / LOCK_NAME).exists()
    monkeypatch.undo()
    with run_lock(run_dir):  # released: the rerun takes it
        pass


def test_the_lock_is_read_without_being_taken(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    assert holder_of(run_dir) is None
    proc = _holder(run_dir, log)
    try:
        who = holder_of(run_dir)
        assert who is not None and who.startswith(f"PID {proc.pid} on host {socket.gethostname()}")
        assert runlock.held_runs([run_dir, tmp_path / "other"]) == [f"{run_dir}: this run is being trained by {who}"]
    finally:
        _release(proc)
    assert holder_of(run_dir) is None and not (run_dir / LOCK_NAME).exists() and not (run_dir / LOG_LINK).exists()
    (run_dir / LOCK_NAME).write_text('{"pid": 1}')  # a killed holder's file: no process holds it
    assert holder_of(run_dir) is None
    with run_lock(run_dir):  # looking took nothing: the lock is free
        assert holder_of(run_dir) is None  # a process's own lock does not count against it


def test_a_refused_job_keeps_the_running_jobs_log(tmp_path):
    """Snakemake deletes a job's log before its script runs: the refused job puts the running job's log back and
    appends its one line (it wrote its traceback over it); the running job's later lines land there too."""
    run_dir, log = tmp_path / "results" / "run", tmp_path / "logs" / "job.log"
    proc = _holder(run_dir, log)
    try:
        log.unlink()  # what Snakemake does before the second job starts
        second = subprocess.run(
            [sys.executable, "-c", "import sys\nfrom fedmedbench.workflow.runlog import log_to\n"
             "from fedmedbench.workflow.runlock import run_lock\nwith log_to(sys.argv[2]):\n"
             "    with run_lock(sys.argv[1], log=sys.argv[2]):\n        print('trained')\n", str(run_dir), str(log)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert second.returncode == 1
        err = second.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"error: {run_dir}: this run is being trained by PID {proc.pid}")
        assert err.endswith(f"; {log} stays the running job's log"), err
        _release(proc)
    finally:
        _release(proc)
    lines = log.read_text().splitlines()
    assert lines[0].endswith("first job: round 1") and "refused a second process" in lines[1], lines
    assert lines[2].endswith("first job: round 2") and len(lines) == 3, lines  # no traceback, nothing trained
    assert not (run_dir / LOG_LINK).exists()


# ----------------------------------------------------------------------------- two snakemakes


def _workflow(tmp_path: Path, rounds: int) -> Path:
    work = copy_workflow(tmp_path / "wf")
    shutil.copytree(ROOT / "profiles", work / "profiles")  # rerun-incomplete, as a checkout runs
    cfg = {"device": "cpu", "threads": {"train": 1},
           "data": {"origin": "synthetic", "synthetic": {"seed": 0, "max_train": 80, "max_val": 20, "max_test": 20}},
           "studies": {"s": {"datasets": ["breastmnist"], "seeds": [0], "methods": ["fedavg"],
                             "settings": {"iid": {"scheme": "iid", "num_clients": 2}},
                             "train": {"rounds": rounds, "local_epochs": 1, "batch_size": 32}}}}
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    return work


RUN = "results/s/breastmnist/iid/fedavg/seed0"
LOG = "logs/train_federated/s/breastmnist/iid/fedavg/seed0.log"


def _snakemake(work: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "snakemake", f"{RUN}/summary.json", "--cores", "1",
                             "--configfile", "c.yaml", *args], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.slow
def test_a_second_snakemake_with_nolock_runs_no_job_of_a_run_being_trained(tmp_path):
    work = _workflow(tmp_path, rounds=2)
    (work / LOG).parent.mkdir(parents=True)
    proc = _holder(work / RUN, work / LOG)
    try:
        out, _ = _snakemake(work, "--nolock").communicate(timeout=600)
    finally:
        _release(proc)
    held = [line for line in out.splitlines() if line.startswith("error:")]
    assert held == [f"error: {RUN}: this run is being trained by PID {proc.pid} on host {socket.gethostname()} "
                    f"(since {held[0].split('(since ')[1].split(')')[0]}); this snakemake would delete that job's log "
                    "and outputs, so it runs no job. Wait for it to finish, or stop that process, then rerun"], out
    assert "Traceback" not in out and not (work / "resources").exists()  # no job ran, not even the data's
    lines = (work / LOG).read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["first job: round 1", "first job: round 2"], lines


@pytest.mark.slow
def test_after_unlock_a_second_snakemake_leaves_the_running_job_alone(tmp_path):
    """The first snakemake trains; after --unlock a second one (rerun-incomplete: its job forced) is refused before
    any job: the first ends with its outputs and its own log (it was rerun, or its outputs and log deleted)."""
    work = _workflow(tmp_path, rounds=60)
    first = _snakemake(work)
    deadline = time.monotonic() + 600
    while holder_of(work / RUN) is None and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert holder_of(work / RUN) is not None, first.communicate()[0][-3000:]
    unlock = subprocess.run([sys.executable, "-m", "snakemake", f"{RUN}/summary.json", "--unlock", "--configfile",
                             "c.yaml"], cwd=work, capture_output=True, text=True, timeout=300)
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    second, _ = _snakemake(work).communicate(timeout=600)
    assert f"error: {RUN}: this run is being trained by PID" in second, second[-3000:]
    assert holder_of(work / RUN) is not None, "the first job ended before the second snakemake was refused"
    out, _ = first.communicate(timeout=900)
    assert first.returncode == 0, out[-3000:]
    assert all((work / RUN / name).is_file() for name in ("metrics.csv", "client_metrics.csv", "summary.json", "model.pt"))
    log = (work / LOG).read_text()
    assert log.splitlines()[0].endswith("job s/breastmnist/iid/fedavg/seed0: 2 Flower node(s) in-process (inline "
                                        "backend), 1 thread(s), device cpu") and "round 60/60" in log, log[:2000]
    assert "Traceback" not in log
