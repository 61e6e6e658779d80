"""Several runs side by side in one process (fl/engine/runs_together.py): each run's outputs are what it trains alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_clients_together import ATOL, RTOL, spec, write_data

from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine.runs_together import RoundPool, run_together
from fedmedbench.fl.methods import _together


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("runs"), 28, 200)


def seeded(s, seed: int):
    return s.__class__(**{**s.__dict__, "seed": seed})


def final_model(s) -> dict[str, torch.Tensor]:
    return torch.load(Path(s.run_dir) / "model.pt", weights_only=True)


def same_rows(a, b, name: str) -> bool:
    """The metric rows of two runs equal but for their timing (float32 rounding: tolerance)."""
    x, y = (pd.read_csv(Path(s.run_dir) / name).drop(columns=["elapsed_s"], errors="ignore") for s in (a, b))
    pd.testing.assert_frame_equal(x, y, check_exact=False, rtol=1e-4, atol=1e-5)
    return len(x) > 0


def counting_calls(monkeypatch) -> list[int]:
    """The number of clients of every train_together call."""
    calls: list[int] = []
    real = _together.train_together

    def counted(ctxs, hooks, **kw):
        calls.append(len(ctxs))
        return real(ctxs, hooks, **kw)

    monkeypatch.setattr(_together, "train_together", counted)
    return calls


def counting_passes(monkeypatch) -> list[int]:
    """The number of models of every predict_together pass."""
    passes: list[int] = []
    real = _together.predict_together

    def counted(models, *args):
        passes.append(len(models))
        return real(models, *args)

    monkeypatch.setattr(_together, "predict_together", counted)
    return passes


@pytest.mark.parametrize(("method", "params"), [("fedavg", {}), ("scaffold", {}), ("fedsmoo", {"rho": 0.05, "lamb": 0.01})])
def test_runs_side_by_side_train_as_each_alone_in_one_call_a_round(setup, monkeypatch, method, params):
    """Three seeds of one method: one train_together call a round for all their clients (3 x 4), and each run's
    final weights and per-round rows are those of the run alone (float32 rounding of the stacked sums)."""
    alone = []
    for seed in (0, 1, 2):
        s = seeded(spec(setup, f"{method}-alone{seed}", method, params=params, batch_clients=True), seed)
        engine.run(s, log=lambda m: None)
        alone.append(s)
    calls = counting_calls(monkeypatch)
    side = [seeded(spec(setup, f"{method}-side{seed}", method, params=params, batch_clients=True), seed) for seed in (0, 1, 2)]
    feds = run_together(side, log=lambda m: None)
    assert calls == [12, 12, 12]  # 3 rounds, each one call of the three runs' 4 clients
    for a, b, f in zip(alone, side, feds, strict=True):
        want, got = final_model(a), final_model(b)
        assert want.keys() == got.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL, msg=k)
        assert f.spec.run_dir == b.run_dir
        assert same_rows(a, b, "metrics.csv") and same_rows(a, b, "client_metrics.csv")
        sa, sb = (json.loads((Path(s.run_dir) / "summary.json").read_text()) for s in (a, b))
        timing = {"wall_time_s", "final"}  # the final row: in same_rows
        for s in (sa, sb):  # the spec kept in the summary names the run's own folder
            s["spec"] = {k: v for k, v in s["spec"].items() if k != "run_dir"}
        assert sa.keys() == sb.keys() and {k: v for k, v in sa.items() if k not in timing} == {
            k: v for k, v in sb.items() if k not in timing}  # the run hash among them
    moved = max(float((final_model(alone[0])[k] - final_model(alone[1])[k]).abs().max()) for k in final_model(alone[0]))
    assert moved > 1e-3  # the seeds train apart: the tolerance is far below what tells them apart


def test_runs_of_other_train_blocks_train_in_separate_calls_at_the_same_point(setup, monkeypatch):
    calls = counting_calls(monkeypatch)
    a = spec(setup, "mixed-a", batch_clients=True)
    b = spec(setup, "mixed-b", batch_clients=True, lr=0.01)
    run_together([a, b], log=lambda m: None)
    assert calls == [4] * 6
    alone = spec(setup, "mixed-b-alone", batch_clients=True, lr=0.01)
    engine.run(alone, log=lambda m: None)
    for k, v in final_model(alone).items():
        torch.testing.assert_close(final_model(b)[k], v, atol=ATOL, rtol=RTOL, msg=k)


def test_a_run_that_trains_one_by_one_withdraws_and_the_others_go_on(setup, monkeypatch):
    calls = counting_calls(monkeypatch)
    said: list[str] = []
    a, b, c = (spec(setup, f"withdraw-{n}", batch_clients=n != "c") for n in "abc")
    b = seeded(b, 1)
    run_together([a, b, c], log=said.append)
    assert calls == [8, 8, 8]  # a and b together every round; c one by one
    assert all((Path(s.run_dir) / "model.pt").is_file() for s in (a, b, c))


def test_runs_of_unequal_lengths_leave_the_pool_as_they_end(setup, monkeypatch):
    calls = counting_calls(monkeypatch)
    short, long = spec(setup, "short", batch_clients=True, rounds=1), spec(setup, "long", batch_clients=True, rounds=3)
    run_together([short, long], log=lambda m: None)
    assert calls == [8, 4, 4]


def test_a_failing_call_fails_every_run_in_it_naming_them(setup, monkeypatch):
    def broken(ctxs, hooks, **kw):
        raise ValueError("boom")

    monkeypatch.setattr(_together, "train_together", broken)
    a, b = spec(setup, "fail-a", batch_clients=True), seeded(spec(setup, "fail-b", batch_clients=True), 1)
    with pytest.raises(RuntimeError, match="2 of 2 runs failed") as info:
        run_together([a, b], log=lambda m: None)
    assert "made in one call" in str(info.value) and "boom" in str(info.value)


def test_an_empty_round_marks_a_run_present_without_training():
    pool = RoundPool(1)
    with pool.member("x"):
        assert pool.train([], []) == []


def test_a_run_drawing_from_the_global_generators_mid_run_draws_as_alone(setup, monkeypatch):
    """A method whose client step draws from torch's global generator every round (here a random gradient
    correction): side by side, each run's draws continue its own stream, as alone, not the other runs'."""
    import numpy as np

    from fedmedbench.fl.methods._sgd import StepHooks, trainable
    from fedmedbench.fl.methods.fedavg import FedAvg

    def noisy(self, ctx):
        np.random.rand()  # NumPy's and torch's global generators both move
        return StepHooks(correction={n: torch.randn(p.shape) * 1e-2 for n, p in trainable(ctx.model).items()})

    monkeypatch.setattr(FedAvg, "hooks", noisy)
    alone = [seeded(spec(setup, f"noisy-alone{s}", batch_clients=True), s) for s in (0, 1)]
    for s in alone:
        engine.run(s, log=lambda m: None)
    side = [seeded(spec(setup, f"noisy-side{s}", batch_clients=True), s) for s in (0, 1)]
    run_together(side, log=lambda m: None)
    for a, b in zip(alone, side, strict=True):
        want, got = final_model(a), final_model(b)
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL, msg=k)


def test_runs_side_by_side_predict_the_shared_test_and_validation_sets_in_one_pass(setup, monkeypatch):
    """Each evaluated round, the runs' global models predict the global test set in one batched pass and the
    validation set in another: every metric of every round equals the run alone to float32 rounding."""
    import pandas as pd

    passes = counting_passes(monkeypatch)
    alone = [seeded(spec(setup, f"eval-alone{s}", batch_clients=True), s) for s in (0, 1, 2)]
    for s in alone:
        engine.run(s, log=lambda m: None)
    assert passes == []
    side = [seeded(spec(setup, f"eval-side{s}", batch_clients=True), s) for s in (0, 1, 2)]
    run_together(side, log=lambda m: None)
    assert passes == [3, 3] * 3  # 3 rounds: the test set, then the validation set, each one pass of 3 models
    for a, b in zip(alone, side, strict=True):
        want, got = (pd.read_csv(Path(x.run_dir) / "metrics.csv") for x in (a, b))
        cols = [c for c in want.columns if c.startswith(("global_", "val_", "local_mean_"))]
        assert cols and len(want) == len(got) == 3
        for c in cols:
            np.testing.assert_allclose(got[c].to_numpy(), want[c].to_numpy(), rtol=1e-5, atol=1e-6, err_msg=c)


def test_a_tensors_fingerprint_is_its_values_not_its_object():
    from fedmedbench.fl.engine.runs_together import fingerprint

    a = torch.arange(12, dtype=torch.uint8).view(3, 4)
    assert fingerprint(a) == fingerprint(a.clone()) == fingerprint(a)  # the second read is the cached digest
    assert fingerprint(a) != fingerprint(a.view(4, 3).clone()) != fingerprint(a.float())
    b = a.clone()
    b[0, 0] = 9
    assert fingerprint(b) != fingerprint(a)


def test_a_tensor_written_in_place_is_fingerprinted_again():
    """A resident model's untrained parameters are written in place each round: the digest cached for the tensor
    object must follow its new values, else runs whose values now differ would share a call."""
    from fedmedbench.fl.engine.runs_together import fingerprint

    frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    before = fingerprint(frozen)
    with torch.no_grad():
        frozen.fill_(0.5)
    assert fingerprint(frozen) == fingerprint(torch.full((3,), 0.5)) != before


def test_a_scalar_tensor_has_a_fingerprint_of_its_value():
    """A model's untrained scalar parameter (a 0-dim tensor) is fingerprinted like any other, by its value."""
    from fedmedbench.fl.engine.runs_together import fingerprint

    assert fingerprint(torch.tensor(1.0)) == fingerprint(torch.tensor(1.0)) != fingerprint(torch.tensor(2.0))
    assert fingerprint(torch.tensor(1.0)) != fingerprint(torch.tensor([1.0]))  # its shape in the digest
def test_an_error_outside_the_call_fails_the_runs_that_wait_instead_of_leaving_them_waiting(setup, monkeypatch):
    """An error while the last run to hand in groups the rounds (before any train_together call) reaches every run
    of that round: none is left waiting for a call that never comes."""
    import threading

    from fedmedbench.fl.engine import runs_together

    def broken(entries):
        raise ValueError("no key")

    monkeypatch.setattr(runs_together, "_calls", broken)  # the grouping, in the thread of the last to hand in
    a, b = spec(setup, "outside-a", batch_clients=True), seeded(spec(setup, "outside-b", batch_clients=True), 1)
    raised: list[BaseException] = []

    def go():
        try:
            run_together([a, b], log=lambda m: None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            raised.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a run was left waiting for its round"
    assert len(raised) == 1 and "2 of 2 runs failed" in str(raised[0]) and "no key" in str(raised[0])


def test_an_interrupt_stops_the_process_while_runs_wait(tmp_path):
    """Ctrl-C (SIGINT) ends a job of runs side by side as it ends a run alone: the process exits at once rather
    than waiting for every run to finish."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "side.py"
    script.write_text(
        "import time\n"
        "from fedmedbench.fl.engine import flower as engine, runs_together\n"
        "def endless(spec, log, pool=None):\n"
        "    print('ready', flush=True)\n"
        "    while True:\n"
        "        time.sleep(0.01)\n"
        "        pool.train([], [])\n"
        "engine.run = endless\n"
        "engine.job_name = str\n"
        "runs_together.run_together(['a', 'b'])\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err


def test_every_line_a_run_side_by_side_logs_names_its_run(setup):
    """The runs of a job share its log: each line says whose it is (a round's line among them), once; a job
    log's console still gets every run's round lines."""
    said: list[str] = []
    shown: list[str] = []

    class JobLog:  # as runlog.JobLog: a line to the log, or to the log and the console
        def __call__(self, line: str) -> None:
            said.append(line)

        def console(self, line: str) -> None:
            shown.append(line)

    a, b = (seeded(spec(setup, f"named-{s}", batch_clients=True, rounds=2), s) for s in (0, 1))
    run_together([a, b], log=JobLog())
    assert sorted(shown) == sorted(line for s in (a, b) for line in shown if line.startswith(
        f"{s.study}/{s.dataset}/{s.setting}/{s.method}/seed{s.seed}: round ")) and len(shown) == 4
    names = [engine.job_name(s) for s in (a, b)]
    assert said and all(sum(line.startswith(n) for n in names) == 1 for line in said), said
    assert all(line.count(n) <= 1 for line in said for n in names)
    assert all(sum(line.startswith(f"{n}: round {r}/2 ") for line in said) == 1 for n in names for r in (1, 2))


@pytest.mark.parametrize("ahead_last", [False, True])
def test_a_run_resumed_a_round_ahead_waits_for_the_others_to_train_with_them(setup, monkeypatch, ahead_last):
    """After a killed job, one run may resume a round ahead of another (its checkpoint written, the other's not):
    its round waits for the other to reach it, so the runs go on in one call a round (not two) and each still
    ends as alone; so too where the run ahead is the last to hand in its round (it makes the other's, then waits)."""
    from fedmedbench.fl.state import checkpoint

    tag = "-last" if ahead_last else ""
    full = spec(setup, f"ahead-full{tag}", batch_clients=True)
    engine.run(full, log=lambda m: None)
    first = engine.run(spec(setup, f"ahead-a{tag}", batch_clients=True, rounds=1), log=lambda m: None)
    a = spec(setup, f"ahead-a{tag}", batch_clients=True)  # the same run, 3 rounds, its checkpoint after round 1
    checkpoint.save(a.run_dir, first.final_state, a.run_hash())
    b = seeded(spec(setup, f"ahead-b{tag}", batch_clients=True), 1)
    calls = counting_calls(monkeypatch)
    said: list[str] = []
    run_together([b, a] if ahead_last else [a, b], log=said.append)
    assert any("resuming from checkpoint at round 1/3" in line for line in said)
    assert calls == [4, 8, 8]  # b's round 1 alone; rounds 2 and 3 of both in one call each
    for k, v in final_model(full).items():
        torch.testing.assert_close(final_model(a)[k], v, atol=ATOL, rtol=RTOL, msg=k)


def test_a_run_whose_loss_is_not_finite_fails_alone_in_a_shared_call(setup, monkeypatch):
    """A non-finite loss of one run's client (train.on_nonfinite: error) fails that run as it would alone, with
    its own error; the runs trained in the same call go on to their outputs, as alone."""
    from fedmedbench.fl.engine.federation import client_generator
    from fedmedbench.fl.training import NonFiniteLossError

    alone = spec(setup, "finite-alone", batch_clients=True)
    engine.run(alone, log=lambda m: None)
    diverging = {client_generator(1, r, p).initial_seed() for r in (1, 2, 3) for p in range(5)}  # seed 1's clients
    real = _together.mean_loss

    def nan_for_seed1(ctx, losses):
        if ctx.generator.initial_seed() in diverging:
            raise NonFiniteLossError(f"non-finite training loss (nan) at round {ctx.rnd}, step 1")
        return real(ctx, losses)

    monkeypatch.setattr(_together, "mean_loss", nan_for_seed1)
    calls = counting_calls(monkeypatch)
    a, b = spec(setup, "finite-a", batch_clients=True), seeded(spec(setup, "finite-b", batch_clients=True), 1)
    with pytest.raises(RuntimeError, match=r"^1 of 2 runs failed \(job t/bloodmnist/fls/fedavg/seed1\): client \d: "
                                           r"non-finite training loss") as info:
        run_together([a, b], log=lambda m: None)
    assert isinstance(info.value.__cause__, NonFiniteLossError)
    assert calls == [8, 4, 4]  # round 1 together (seed 1 fails there), then seed 0 on its own
    for k, v in final_model(alone).items():
        torch.testing.assert_close(final_model(a)[k], v, atol=ATOL, rtol=RTOL, msg=k)
    assert not (Path(b.run_dir) / "model.pt").exists()


def test_every_failed_run_leaves_its_error_in_the_log(setup, monkeypatch):
    """Two runs failing with their own errors: the raised error names both runs and carries the first; the log
    has each run's error with its traceback (not only the first's)."""
    def failing(s, log, pool=None):
        raise ValueError(f"bad input of seed {s.seed}")

    monkeypatch.setattr(engine, "run", failing)
    said: list[str] = []
    a, b = spec(setup, "errors-a"), seeded(spec(setup, "errors-b"), 1)
    with pytest.raises(RuntimeError, match=r"^2 of 2 runs failed .*: bad input of seed [01]$"):
        run_together([a, b], log=said.append)
    for s in (a, b):
        mine = [line for line in said if line.startswith(f"{engine.job_name(s)}: ")]
        assert len(mine) == 1 and f"ValueError: bad input of seed {s.seed}" in mine[0] and "Traceback" in mine[0]


def test_runs_whose_untrained_parameters_differ_train_in_separate_calls(setup, monkeypatch):
    """The batched step takes parameters that are not trained from the first run's model: runs whose frozen
    parameters differ (their own random draws) cannot share it, and each trains as alone."""
    real_model_with = engine.fed.Job.model_with

    def frozen_stem(self, arrays):
        model = real_model_with(self, arrays)
        model.stem.bias.requires_grad_(False)
        with torch.no_grad():
            model.stem.bias.fill_(0.01 * (self.spec.seed + 1))  # a frozen value of each run's own
        return model

    monkeypatch.setattr(engine.fed.Job, "model_with", frozen_stem)
    calls = counting_calls(monkeypatch)
    side = [seeded(spec(setup, f"frozen-side{s}", batch_clients=True), s) for s in (0, 1)]
    run_together(side, log=lambda m: None)
    assert calls == [4, 4] * 3  # two calls a round: the runs' frozen stems differ


def test_runs_whose_models_normalise_their_input_otherwise_predict_apart(setup, monkeypatch):
    """A model's input normalisation is a hook on it (train.input_norm), not a parameter: runs of one network whose
    hooks differ predict the same images in separate passes, each as alone."""
    passes = counting_passes(monkeypatch)
    alone = spec(setup, "norm-alone", batch_clients=True, rounds=1, input_norm="single")
    engine.run(alone, log=lambda m: None)
    a = seeded(spec(setup, "norm-double", batch_clients=True, rounds=1), 1)
    b = spec(setup, "norm-single", batch_clients=True, rounds=1, input_norm="single")
    run_together([a, b], log=lambda m: None)
    assert passes == []  # every pass of one model: predicted alone
    want, got = (pd.read_csv(Path(x.run_dir) / "metrics.csv") for x in (alone, b))
    cols = [c for c in want.columns if c.startswith(("global_", "val_"))]
    assert cols
    for c in cols:
        np.testing.assert_allclose(got[c].to_numpy(), want[c].to_numpy(), rtol=1e-5, atol=1e-6, err_msg=c)
