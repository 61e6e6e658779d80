"""The micro pipeline submitted to a REAL single-node SLURM (tests/cluster/slurm.sh) equals a local run,
with one training job pre-empted (scancel) mid-run and resumed from its checkpoint.

Needs root and Debian's slurmctld/slurmd/slurm-client/munge (installed by the cluster script when
missing). Skipped elsewhere, or with FMB_SKIP_SLURM=1.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import copy_workflow

from fedmedbench.fl.state.file_format import read_state

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "cluster" / "slurm.sh"
RUNS = Path("results/micro/breastmnist/dir")
SCAFFOLD = RUNS / "scaffold" / "seed0"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("FMB_SKIP_SLURM") == "1", reason="FMB_SKIP_SLURM=1"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None and shutil.which("slurmctld") is None,
                       reason="needs root and Debian packages for a real SLURM"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm-state")
    env = {**os.environ, "FMB_SLURM_STATE": str(state), "FMB_SLURM_PORT": "16917"}
    up = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=600)
    if up.returncode != 0:  # a fixture that fails in setup gets no teardown: stop what was started
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    env["SLURM_CONF"] = str(state / "slurm.conf")
    yield env
    subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)


def workflow_copy(dest: Path) -> Path:
    copy_workflow(dest)
    shutil.copy(ROOT / "tests" / "fixtures" / "slurm.yaml", dest / "micro.yaml")
    return dest


@dataclass
class Runs:
    local: Path
    slurm: Path
    returncode: int
    out: str
    cancelled_at_round: int | None


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory) -> Runs:
    """The micro pipeline run locally and, beside it, submitted to SLURM (whose jobs mostly wait on the scheduler).
    On SLURM the scaffold training job is scancel-ed mid-federation (as pre-emption or a time limit would);
    Snakemake resubmits it (--retries)."""
    tmp = tmp_path_factory.mktemp("slurm-runs")
    local, slurm = workflow_copy(tmp / "local"), workflow_copy(tmp / "slurm")
    shutil.copytree(ROOT / "tests" / "cluster" / "profile", slurm / "profile")
    snake = [sys.executable, "-m", "snakemake", "--configfile", "micro.yaml"]
    with (tmp / "local.log").open("w") as log:
        reference = subprocess.Popen([*snake, "--cores", "2"], cwd=local, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
    try:
        runs = _slurm_run(cluster, snake, slurm)
        assert reference.wait(timeout=900) == 0, (tmp / "local.log").read_text()[-3000:]
    finally:
        if reference.poll() is None:  # a failed SLURM run: stop the local one and its jobs
            os.killpg(reference.pid, signal.SIGKILL)
            reference.wait()
    return Runs(local, slurm, *runs)


def _slurm_run(cluster: dict[str, str], snake: list[str], slurm: Path) -> tuple[int, str, int | None]:
    """The SLURM run's exit status and output, and the round at which its scaffold job was cancelled."""
    proc = subprocess.Popen([*snake, "--profile", "profile", "--retries", "2"], cwd=slurm, env=cluster,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt = slurm / SCAFFOLD / "checkpoint" / "server.pt"
    cancelled = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and cancelled is None:
        if ckpt.exists():
            try:
                rnd = int(read_state(ckpt)["round"])
            except Exception:  # noqa: BLE001 - being replaced
                rnd = 0
            if 1 <= rnd < 10:
                q = subprocess.run(["squeue", "-h", "-o", "%i %j %k"], env=cluster, capture_output=True, text=True)
                for line in q.stdout.splitlines():
                    job_id, *rest = line.split()
                    comment = " ".join(rest)  # rule_<rule>_wildcards_<wildcard values>
                    if "train_federated" in comment and "scaffold" in comment:
                        subprocess.run(["scancel", job_id], env=cluster, check=True)
                        cancelled = rnd
                        break
        time.sleep(0.1)
    out, _ = proc.communicate(timeout=1200)
    return proc.returncode, out, cancelled


def test_slurm_run_equals_local_run(runs):
    assert runs.returncode == 0, runs.out[-4000:]
    assert "100%" in runs.out
    for method in ("fedavg", "scaffold"):
        run = RUNS / method / "seed0"
        a = torch.load(runs.local / run / "model.pt", weights_only=True)
        b = torch.load(runs.slurm / run / "model.pt", weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a), method
        pd.testing.assert_frame_equal(pd.read_csv(runs.local / run / "metrics.csv").drop(columns="elapsed_s"),
                                      pd.read_csv(runs.slurm / run / "metrics.csv").drop(columns="elapsed_s"))
    # the jobs really went through SLURM (the plugin reports each submission's SLURM job id)
    submitted = re.findall(r"submitted with SLURM jobid", runs.out, flags=re.IGNORECASE)
    assert len(submitted) >= 4, runs.out[-3000:]  # synthesize, partition, 2 x train (tables/plots are localrules)


def test_preempted_training_job_resumes_from_its_checkpoint(runs):
    """The cancelled job's resubmission continues from the last completed round, not from scratch
    (the equality with the local run is checked above)."""
    assert runs.cancelled_at_round is not None, "no running training job was caught to cancel\n" + runs.out[-2000:]
    assert runs.returncode == 0, runs.out[-4000:]
    log = (runs.slurm / "logs/train_federated/micro/breastmnist/dir/scaffold/seed0.log").read_text()
    assert "resuming from checkpoint at round" in log
    resumed = int(re.search(r"resuming from checkpoint at round (\d+)", log).group(1))
    assert 1 <= resumed <= 12
