"""Round progress: one line per round on the console (job, round r/R, metric, s/round, ETA), full record in the log."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from fedmedbench.fl.federation import console_line, progress_line
from fedmedbench.fl.spec import RunSpec


def _spec() -> RunSpec:
    return RunSpec.from_dict({"run_dir": "r", "study": "quickstart", "dataset": "breastmnist", "setting": "dir0.5",
                              "method": "fedavg", "seed": 1, "partition_path": "p.json", "sources": {"base": "b.npz"},
                              "image_size": 28, "model": "cnn_small", "train": {"rounds": 10}})


def test_console_line_names_job_round_metric_rate_and_eta():
    row = {"round": 4, "elapsed_s": 10.0, "train_loss": 0.5, "global_accuracy": 0.8125, "growth_rate": 0.1}
    line = console_line(_spec(), row, total=10, primary="accuracy")
    # 10 s over 4 rounds = 2.5 s/round; 6 rounds left = 15 s
    assert line == "quickstart/breastmnist/dir0.5/fedavg/seed1: round 4/10 | global_accuracy 0.8125 | 2.5 s/round | ETA 15s"
    assert "round 4/10" in progress_line(row, 10, "accuracy") and "growth_rate 0.1000" in progress_line(row, 10, "accuracy")


def test_console_line_without_evaluation_shows_train_loss_and_long_eta():
    row = {"round": 1, "elapsed_s": 100.0, "train_loss": 0.25, "global_accuracy": float("nan")}
    line = console_line(_spec(), row, total=100, primary="accuracy")
    assert "train_loss 0.2500" in line and "100.0 s/round" in line and line.endswith("ETA 2h45m")


def test_log_console_reaches_the_console_and_the_log(tmp_path):
    log_file = tmp_path / "job.log"
    code = textwrap.dedent(f"""
        from fedmedbench.runlog import log_to
        with log_to({str(log_file)!r}) as log:
            print("library chatter")
            log("only in the log")
            log.console("round 1/2 | on the console")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "round 1/2 | on the console" in proc.stderr
    assert "only in the log" not in proc.stderr + proc.stdout and "library chatter" not in proc.stderr + proc.stdout
    text = log_file.read_text()
    assert "library chatter" in text and "only in the log" in text and "round 1/2 | on the console" in text
