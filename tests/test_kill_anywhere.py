"""Kill anywhere, rerun with --rerun-incomplete: completed jobs are not redone, federations resume from
their last completed round, and final results are bit-identical to an uninterrupted run (CPU)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import copy_workflow

from fedmedbench.fl.state.file_format import read_state

ROOT = Path(__file__).resolve().parents[1]
RUNS = [Path("results/micro/breastmnist/dir") / m / "seed0" for m in ("scaffold", "fedavg")]
pytestmark = pytest.mark.slow


def workflow_copy(dest: Path) -> Path:
    copy_workflow(dest)
    shutil.copy(ROOT / "tests" / "fixtures" / "killrun.yaml", dest / "micro.yaml")
    return dest


def snakemake(cwd: Path, *extra: str, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "micro.yaml", "--rerun-incomplete", *extra]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)


def kill_when(proc: subprocess.Popen, condition, timeout=600) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.05)
    proc.wait()
    return False


def checkpoint_round(path: Path) -> int:
    try:
        return int(read_state(path)["round"])
    except Exception:  # noqa: BLE001 - absent or being replaced
        return 0


def unlock(cwd: Path) -> None:
    """What a user does after a killed Snakemake: remove its stale lock."""
    subprocess.run([sys.executable, "-m", "snakemake", "--unlock", "--configfile", "micro.yaml"], cwd=cwd,
                   capture_output=True, timeout=120, check=True)


def finish(cwd: Path, env=None) -> str:
    proc = snakemake(cwd, env=env)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_kill_anywhere_then_rerun_is_bit_identical(tmp_path):
    ref = workflow_copy(tmp_path / "ref")
    finish(ref)

    work = workflow_copy(tmp_path / "work")
    ckpt = work / RUNS[0] / "checkpoint" / "server.pt"

    # 1. SIGKILL snakemake and its jobs in the middle of the first federation (round >= 1 checkpointed)
    assert kill_when(snakemake(work), lambda: checkpoint_round(ckpt) >= 1), "run ended before the kill"
    at_kill = checkpoint_round(ckpt)
    assert 1 <= at_kill < 4
    unlock(work)

    # 2. the training job kills itself while writing a checkpoint (after the temp file, before the rename)
    env = {**os.environ, "FEDMEDBENCH_FAULT_KILL_BEFORE_RENAME": "*/checkpoint/server.pt"}
    proc = snakemake(work, env=env)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode != 0
    assert checkpoint_round(ckpt) == at_kill  # the checkpoint being written never replaced the good one
    # 3. let training finish, then SIGKILL during table aggregation
    agg_log = work / "logs" / "aggregate_results" / "micro.log"
    proc = snakemake(work)
    killed = kill_when(proc, agg_log.exists)
    unlock(work)
    # 4. final rerun: completes, without redoing completed jobs
    out = finish(work)
    assert "rule synthesize_medmnist" not in out and "rule build_partition" not in out
    if killed:
        assert "rule train_federated" not in out  # both federations had completed before the aggregation kill
    log = (work / "logs" / "train_federated" / "micro" / "breastmnist" / "dir" / "scaffold" / "seed0.log").read_text()
    assert f"resuming from checkpoint at round {at_kill}/4" in log

    for run in RUNS:
        a = torch.load(ref / run / "model.pt", weights_only=True)
        b = torch.load(work / run / "model.pt", weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a), run
        pd.testing.assert_frame_equal(pd.read_csv(ref / run / "metrics.csv").drop(columns="elapsed_s"),
                                      pd.read_csv(work / run / "metrics.csv").drop(columns="elapsed_s"))
    ta = pd.read_csv(ref / "results/micro/tables/final_metrics_synthetic.csv")
    tb = pd.read_csv(work / "results/micro/tables/final_metrics_synthetic.csv")
    pd.testing.assert_frame_equal(ta, tb)
