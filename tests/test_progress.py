"""Round progress: one line per round on the console (job, round r/R, metric, s/round, ETA), full record in the log."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from fedmedbench.fl.engine.federation import console_line, progress_line
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
        from fedmedbench.workflow.runlog import log_to
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


def test_round_clock_leaves_start_up_out_of_the_eta():
    """58 s of start-up then a 2 s round: 2 s/round and 18 s left for 10 rounds (not 60 s/round, 9 min)."""
    from fedmedbench.fl.engine.federation import RoundClock

    now = [0.0]
    clock = RoundClock(lambda: now[0])
    now[0] = 58.0  # imports, data, model, Flower start-up
    clock.start()
    now[0] = 60.0
    clock.stop()
    assert clock.per_round() == 2.0
    row = {"round": 1, "elapsed_s": 60.0, "train_loss": 0.5, "global_accuracy": 0.5}
    assert console_line(_spec(), row, total=10, primary="accuracy", per_round=clock.per_round()).endswith("2.0 s/round | ETA 18s")
    assert progress_line(row, 10, "accuracy", clock.per_round()).endswith("elapsed 60.0s ETA 18.0s")
    now[0] = 64.0
    clock.start()
    now[0] = 68.0
    clock.stop()
    assert clock.per_round() == 3.0  # the mean of the rounds' own times


def test_engine_eta_excludes_the_time_before_round_one(tmp_path, monkeypatch):
    """A run whose start-up takes 1000 s (a shifted clock) still reports its rounds' own seconds."""
    from helpers import split_labels

    from fedmedbench.data import synthetic
    from fedmedbench.fl.engine import federation as fed
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.partition import schemes as P
    from fedmedbench.workflow import io

    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 60, "val": 20, "test": 20})
    io.write_npz(tmp_path / "b.npz", arrays)
    io.write_json(tmp_path / "p.json", P.build_partition(split_labels(arrays), "iid", 2, 0, {}, num_classes=2))
    shift = [0.0]
    real = fed.time.monotonic
    monkeypatch.setattr(fed.time, "monotonic", lambda: real() + shift[0])
    initial_state = fed.Federation.initial_state

    def slow_start(self):
        shift[0] += 1000.0  # the job's start-up
        return initial_state(self)

    monkeypatch.setattr(fed.Federation, "initial_state", slow_start)
    lines: list[str] = []

    class Log:
        def __call__(self, msg: str) -> None:
            pass

        def console(self, msg: str) -> None:
            lines.append(msg)

    spec = RunSpec(run_dir=str(tmp_path / "run"), study="t", dataset="breastmnist", setting="iid", method="fedavg", seed=0,
                   partition_path=str(tmp_path / "p.json"), sources={"base": str(tmp_path / "b.npz")}, image_size=28,
                   train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05}, device="cpu", threads=1, model="cnn_small")
    engine.run(spec, Log())
    assert [line.split(" | ")[0] for line in lines] == ["t/breastmnist/iid/fedavg/seed0: round 1/2",
                                                         "t/breastmnist/iid/fedavg/seed0: round 2/2"]
    per_round = float(lines[0].split(" | ")[2].split()[0])
    assert per_round < 100, lines[0]  # with the start-up counted it would be over 1000 s/round
