"""The grid-cost arithmetic of the surgical studies (bench/_surgical_cost.py) on hand-made round times."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.script_runner import ScriptRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _surgical_cost import evaluations, split_rounds  # noqa: E402


def test_evaluations_count_every_kth_round_and_the_last():
    assert evaluations(300, 10) == 30  # fedst: rounds 10, 20, ..., 300
    assert evaluations(25, 10) == 3  # 10, 20 and the last, 25
    assert evaluations(20, 1) == 20
    assert evaluations(3, 0) == 3  # eval_every 0 reads as every round


def test_a_grid_is_costed_at_each_jobs_method_and_pair():
    """grid_cost --scale-by: the methods timed on one (dataset, setting) pair, the first of them also on others; a job
    costs its method's rate times its pair's ratio, an untimed pair its dataset's ratio times its setting's."""
    from grid_cost import grid_seconds, pair_factors

    base = ("derma", "dir")
    factor = pair_factors({base: 2.0, ("blood", "dir"): 3.0, ("derma", "qty"): 4.0}, base)
    assert factor("derma", "dir") == 1.0 and factor("blood", "dir") == 1.5 and factor("derma", "qty") == 2.0
    assert factor("blood", "qty") == 3.0  # untimed: 1.5 x 2.0
    assert factor("blood", "path") == 1.5 and factor("derma", "path") == 1.0  # an untimed setting costs as the base
    jobs = [{"dataset": "derma", "setting": "dir", "method": "a", "rounds": 10},
            {"dataset": "blood", "setting": "qty", "method": "b", "rounds": 10},
            {"dataset": "blood", "setting": "dir", "method": "c", "rounds": 2}]  # c untimed: the mean of a and b
    assert grid_seconds(jobs, {"a": 2.0, "b": 6.0}, factor) == pytest.approx(10 * 2.0 + 10 * 6.0 * 3.0 + 2 * 4.0 * 1.5)


def test_training_and_evaluation_time_come_apart():
    train, evaluation, _ = split_rounds([9.0, 2.0, 2.2, 3.1])  # round 1 warms up; only round 4 evaluates
    assert train == pytest.approx(2.1) and evaluation == pytest.approx(1.0)
    assert split_rounds([9.0, 2.0, 1.5])[:2] == (2.0, 0.0)  # an evaluation faster than noise costs nothing, not less
    assert split_rounds([4.0, 3.0])[:2] == (3.0, 0.0)  # too few rounds to split: the last round, evaluation included


def test_a_timing_logs_every_round_with_the_clock(blood_dir, capsys):
    """A timing stopped at a limit still shows how far it got: every round is logged, stamped with the time."""
    import re

    from _timing import progress, time_spec
    from test_device_arrays import make_spec

    lines: list[str] = []
    per_round = time_spec(make_spec(blood_dir, "fedavg", "timed"), log=lines.append)
    assert len(per_round) == 3 and [re.search(r"round (\d)/3", m).group(1) for m in lines if "/3" in m] == ["1", "2", "3"]
    progress("round 1/3")
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] round 1/3\n", capsys.readouterr().err)


GPU_SESSION = Path(__file__).resolve().parents[1] / "bench" / "gpu_session.sh"


def _fake_mps(bin_dir: Path, log: Path) -> None:
    """An nvidia-cuda-mps-control that writes "start" for -d and the command it reads otherwise ("quit") to log."""
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(f'#!/bin/bash\nif [ "$1" = -d ]; then echo start >> {log}; else read c; echo "$c" >> {log}; fi\n')
    fake.chmod(0o755)


def _run_session(tmp_path: Path, python: str, fail: str = "", steps: str = "", **env_extra: str
                 ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPS", "SURGICAL_DIR", "STAND_IN", "BUDGET", "STEP_LIMIT",
                                                                "FEDST_FRACTION", "FEDST_TEST_FRACTION",
                                                                "ULTRAFLWR_FRACTION")}
    _fake_mps(tmp_path / "bin", tmp_path / "mps.log")
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    return subprocess.run(["bash", str(GPU_SESSION), str(tmp_path / "rows.jsonl")], capture_output=True, text=True,
                          env={**env, "PYTHON": python, "FAIL": fail or "no step has this", "STAND_IN": str(tmp_path / "si"),
                               **({"STEPS": steps} if steps else {}), **env_extra}, timeout=120)


WITH_MPS = GPU_SESSION.parent / "with_mps.sh"


def test_with_mps_runs_the_command_between_the_daemons_start_and_quit(tmp_path):
    """bench/with_mps.sh: the daemon started, the command run with FMB_MPS=1 and its exit status kept, the daemon
    quit even when the command failed; no nvidia-cuda-mps-control: exit 2, saying so."""
    _fake_mps(tmp_path / "bin", tmp_path / "mps.log")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(WITH_MPS), "bash", "-c", 'echo "mps=$FMB_MPS"; exit 3'], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 3 and "mps=1" in done.stdout
    assert (tmp_path / "mps.log").read_text().split() == ["start", "quit"]
    (tmp_path / "empty").mkdir()  # a PATH without it, even where NVIDIA's utilities sit in /usr/bin
    bare = {**os.environ, "PATH": str(tmp_path / "empty")}
    done = subprocess.run([shutil.which("bash"), str(WITH_MPS), "true"], capture_output=True, text=True, env=bare,
                          timeout=60)
    assert done.returncode == 2 and "nvidia-cuda-mps-control is not on the PATH" in done.stderr


def test_gpu_session_refuses_a_machine_without_cuda(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n[ \"$1\" = -c ] && exit 1\nexit 0\n")  # torch sees no CUDA device
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake))
    assert done.returncode == 2 and "no CUDA device" in done.stderr
    assert not (tmp_path / "rows.jsonl").exists() and not (tmp_path / "gpu_session.log").exists()


def test_gpu_session_names_missing_packages_before_any_step(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n[ \"$1\" = -c ] && { case \"$2\" in *find_spec*) echo medmnist flwr;; esac; exit 0; }\n"
                    f"echo \"$*\" >> {tmp_path / 'calls'}\n")
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake))
    assert done.returncode == 2 and "lacks: medmnist flwr" in done.stderr and "bench/gpu_wheels.sh" in done.stderr
    assert not (tmp_path / "calls").exists() and not (tmp_path / "gpu_session.log").exists()  # no step ran


def test_gpu_session_installs_carried_wheels_before_it_checks_packages(tmp_path):
    """WHEELS=DIR (an offline GPU machine, the wheels of bench/gpu_wheels.sh carried there): pip installs them from
    DIR alone into WHEELS_SITE, and every step imports this tree's package first, then them; a DIR without wheels
    stops the session before any step, naming it."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n[ \"$1\" = -c ] && exit 0\n"
                    f"echo \"$*\" >> {calls}\n"
                    f"echo \"$PYTHONPATH\" >> {tmp_path / 'paths'}\n")
    fake.chmod(0o755)
    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    done = _run_session(tmp_path, str(fake), steps="CUDA tests", WHEELS=str(wheels), WHEELS_SITE=str(site))
    assert done.returncode == 2 and f"WHEELS={wheels} holds no .whl file" in done.stderr and not calls.exists()
    (wheels / "flwr-1.42.0-py3-none-any.whl").write_bytes(b"")
    done = _run_session(tmp_path, str(fake), steps="CUDA tests", WHEELS=str(wheels), WHEELS_SITE=str(site))
    assert done.returncode == 0, done.stdout + done.stderr
    install, step = calls.read_text().splitlines()
    assert install.startswith("-m pip install") and "--no-index --no-deps" in install
    assert f"--target {site} {wheels}/flwr-1.42.0-py3-none-any.whl" in install
    src = str(GPU_SESSION.parents[1] / "src")
    assert "tests/test_cuda.py" in step and (tmp_path / "paths").read_text().splitlines()[-1].split(":")[:2] == [
        src, str(site)]


def test_gpu_session_runs_every_step_and_fails_only_on_a_required_one(tmp_path):
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n[ \"$1\" = -c ] && exit 0\n"  # CUDA check and version line
                    f"echo \"$*\" >> {calls}\n"
                    f"echo \"$PYTHONPATH\" >> {tmp_path / 'paths'}\n"
                    "case \"$*\" in *\"$FAIL\"*) exit 3;; esac\n")
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake))
    assert done.returncode == 0, done.stdout + done.stderr
    ran = calls.read_text().splitlines()
    stand_ins = [c for c in ran if "surgical_stand_in.py" in c]  # built in the background from the start
    steps = [c for c in ran if c not in stand_ins]
    assert len(stand_ins) == 2 and len(steps) == 33 and all(f"--out {tmp_path / 'rows.jsonl'}" in c for c in steps[1:])
    assert "tests/test_cuda.py tests/test_device_arrays.py" in steps[0]
    assert [c.split(" --out")[0] for c in steps[1:3]] == [  # fedst's frame scoring, both ways
        "bench/segmetrics_device.py --device cuda --frames 64 --numpy-frames 16",
        "bench/segmetrics_device.py --device cuda --frames 64 --numpy-frames 16 --noise 0.1"]
    src = str(GPU_SESSION.parents[1] / "src")
    assert all(p.split(":")[0] == src for p in (tmp_path / "paths").read_text().splitlines())  # this tree's package
    assert any("earlystop.yaml" in c and "--resident" in c and f"--torch-profile {tmp_path}/" in c for c in ran)
    assert any("host_overhead.py --device cuda --width 0" in c and "in-round" not in c for c in ran)
    assert any("host_overhead.py --device cuda --width 0" in c and "--checkpoint-writes in-round" in c for c in ran)
    assert sum("--deterministic" in c for c in ran) == 1  # one engine run with deterministic kernels
    earlystop = [c for c in steps if "grid_cost.py --config config/studies/earlystop.yaml" in c]
    assert ["--no-batch-clients" in c for c in earlystop] == [True, False, True, False, False, False]  # one by one
    assert [c.count("--setting qty0.01") for c in earlystop] == [0, 0, 1, 0, 0, 0]  # quantity skew one by one
    assert "--scale-by bloodmnist/dir0.01 dermamnist/qty0.01 " in earlystop[1]  # ... and together
    assert ["--autocast bf16" in c for c in earlystop] == [False] * 3 + [True, False, False]
    assert f"--torch-profile {tmp_path}/earlystop_together_profile.txt" in earlystop[4]
    assert ["--runs-together 3" in c for c in earlystop] == [False] * 5 + [True]  # seeds side by side
    assert "--batch-clients" in earlystop[5]
    packing = [c for c in steps if "gpu_packing.py" in c and "--study" not in c]  # the earlystop ones
    assert ["--no-batch-clients" in c for c in packing] == [True, False, False, False] and "--batch-clients" in packing[1]
    assert ["--runs-together 3" in c for c in packing] == [False, False, False, True]
    assert packing[2] == packing[1]  # again under MPS, started and stopped around it
    assert (tmp_path / "mps.log").read_text().split() == ["start", "quit"]
    for study in ("fedst", "ultraflwr"):  # each surgical grid is timed on its stand-in, once that is built
        build = next(i for i, c in enumerate(ran) if "surgical_stand_in.py" in c and f"{study}.yaml" in c)
        assert f"--out {tmp_path / 'si' / study}" in ran[build]
        assert (tmp_path / "si" / f"{study}.rc").read_text().strip() == "0"
        timed = [i for i, c in enumerate(ran) if f"{study}.yaml" in c and "grid_cost.py" in c]
        assert len(timed) == {"fedst": 3, "ultraflwr": 4}[study] and min(timed) > build
        assert all(f"--surgical-dir {tmp_path / 'si' / study}" in ran[i] for i in timed)
    assert any("ultraflwr.yaml" in c and "--image-cache" in c and "--loader-workers 1" in c for c in steps)  # read ahead
    assert "--fraction 0.02" in next(c for c in stand_ins if "ultraflwr.yaml" in c)
    assert "--test-fraction 0.1" in next(c for c in stand_ins if "fedst.yaml" in c)
    assert "--study gpaf_pathmnist" in steps[-2] and "--waiting-steps" not in steps[-2]
    assert "--study gpaf_pathmnist" in steps[-1] and "--methods fedavg --waiting-steps" in steps[-1]
    assert "--methods seg_fedavg " in steps[-6] and "--methods fedst " in steps[-5]  # the lower and the upper bound
    assert "--image-cache" not in steps[-6] + steps[-5]
    assert "--methods seg_fedavg " in steps[-4] and f"--image-cache {tmp_path / 'si' / 'frames'}" in steps[-4]
    assert steps[-3].startswith("bench/gpu_packing.py --config config/studies/fedst.yaml --study fedst")
    assert f"--surgical-dir {tmp_path / 'si' / 'fedst'}" in steps[-3]  # fedst jobs sharing the GPU
    assert "--surgical-epochs 2" in steps[-12] and "--yolo-workers" not in steps[-12] and "--image-cache" not in steps[-12]
    assert "--yolo-workers 8" in steps[-11]
    assert f"--image-cache {tmp_path / 'si' / 'frames'}" in steps[-10] and "--yolo-workers" not in steps[-10]
    assert "--loader-workers" not in steps[-10] and f"--image-cache {tmp_path / 'si' / 'frames'}" in steps[-9]
    assert "--loader-workers 1" in steps[-9] and "--yolo-workers" not in steps[-9]  # the frame cache, read ahead
    assert steps[-8].startswith("bench/gpu_packing.py --config config/studies/ultraflwr.yaml --study ultraflwr")
    assert f"--surgical-dir {tmp_path / 'si' / 'ultraflwr'}" in steps[-8]  # ultraflwr jobs sharing the GPU
    assert steps[-7].startswith("bench/yolo_read_ahead.py") and "--pixel-thread --device cuda" in steps[-7]
    waiting = [c for c in ran if "--waiting-steps" in c]  # each before/after right after its after side
    assert len(waiting) == 2 and ran[ran.index(waiting[0]) - 1].startswith("bench/engine_overhead.py")
    assert "FAILED" not in done.stdout.split("== summary")[1]
    calls.unlink()
    done = _run_session(tmp_path, str(fake), fail="gpu_packing.py")
    assert done.returncode == 1 and "FAILED (rc 3)" in done.stdout
    assert len(calls.read_text().splitlines()) == 35  # the failure stopped no later step
    calls.unlink()
    done = _run_session(tmp_path, str(fake), fail="ultraflwr.yaml --out", steps="ultraflwr")
    ran = calls.read_text().splitlines()  # a failed build fails its step, and the timings that read it run and fail
    assert done.returncode == 1 and len(ran) == 7 and "FAILED (rc 3)" in done.stdout.split("== summary")[1]
    assert "ultraflwr stand-in" in done.stdout.split("== summary")[1].split("FAILED")[0].splitlines()[-1]
    calls.unlink()
    done = _run_session(tmp_path, str(fake), steps="grid cost", SURGICAL_DIR=str(tmp_path / "real"))
    ran = calls.read_text().splitlines()  # the real videos' exports: no stand-in, both grids read them
    assert done.returncode == 0 and not [c for c in ran if "surgical_stand_in.py" in c]
    assert sum(f"--surgical-dir {tmp_path / 'real'}" in c for c in ran) == 7
    calls.unlink()
    done = _run_session(tmp_path, str(fake), steps="CUDA tests|pathmnist")  # a part of the session
    ran = calls.read_text().splitlines()
    assert done.returncode == 0 and len(ran) == 3 and "tests/test_cuda.py" in ran[0]
    assert all("--study gpaf_pathmnist" in c for c in ran[1:])
    assert "cuda tests" in done.stdout.split("== summary")[1] and "jobs per GPU" not in done.stdout
    calls.unlink()
    for steps, needle in (("pathmnsit", "matches no step"), ("gpaf(", "not an extended regular expression")):
        done = _run_session(tmp_path, str(fake), steps=steps)  # a typo runs nothing and says so
        assert done.returncode == 2 and needle in done.stderr and not calls.exists()


def test_gpu_session_stops_a_step_at_its_limit_and_starts_none_past_its_budget(tmp_path):
    """A GPU allocation is minutes long: STEP_LIMIT stops a step that runs over (the later ones still run), and
    BUDGET stops the session, each step running at most what is left and none starting with under 30 s left."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n[ \"$1\" = -c ] && exit 0\n"
                    f"echo \"$*\" >> {calls}\n"
                    "case \"$*\" in *\"$SLOW\"*) sleep \"$NAP\";; esac\n")
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake), steps="cuda tests|batch 50|persistence", STEP_LIMIT="1", SLOW="--model",
                        NAP="20")
    summary = done.stdout.split("== summary")[1]
    assert done.returncode == 1 and len(calls.read_text().splitlines()) == 3  # the step after it still ran
    assert "TIMED OUT (limit 1 s" in [line for line in summary.splitlines() if "batch 50" in line][0]
    assert summary.count("ok") == 2
    calls.unlink()
    done = _run_session(tmp_path, str(fake), steps="cuda tests|batch 50|persistence", BUDGET="33", SLOW="test_cuda",
                        NAP="4")
    summary = done.stdout.split("== summary")[1]
    assert done.returncode == 0 and len(calls.read_text().splitlines()) == 1  # 29 s left after the first step
    assert summary.count("skipped (BUDGET spent)") == 2 and "skipped, 2" in done.stdout


def test_gpu_session_builds_the_stand_ins_at_the_shares_it_is_given(tmp_path):
    """A session of minutes builds smaller stand-ins sooner: FEDST_FRACTION, FEDST_TEST_FRACTION and
    ULTRAFLWR_FRACTION reach the builds (the defaults are asserted in the test above)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/bash\n[ \"$1\" = -c ] && exit 0\necho \"$*\" >> {calls}\n")
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake), steps="stand-in", FEDST_FRACTION="0.1", FEDST_TEST_FRACTION="0.05",
                        ULTRAFLWR_FRACTION="0.05")
    assert done.returncode == 0, done.stdout + done.stderr
    builds = {study: c for c in calls.read_text().splitlines() for study in ("fedst", "ultraflwr")
              if "surgical_stand_in.py" in c and f"{study}.yaml" in c}
    assert "--fraction 0.1 --test-fraction 0.05 " in builds["fedst"]
    assert "--fraction 0.05 " in builds["ultraflwr"]


STUDIES = Path(__file__).resolve().parents[1] / "config" / "studies"


@pytest.mark.parametrize("config_name", ["earlystop.yaml", "gpaf.yaml"])
def test_grid_cost_times_every_method_with_the_parameters_the_workflow_gives_it(config_name, tmp_path):
    """Each timed job is the grid's own: its method parameters resolved as rules/common.smk resolves them
    (GPAF's ``label_alpha: partition`` becomes the setting's alpha), and every method builds from them."""
    import grid_cost

    from fedmedbench.fl.api.registry import get_method

    config = grid_cost.load_config(STUDIES / config_name)
    for study, st in config["studies"].items():
        jobs = grid_cost.grid_jobs(config, study)
        assert len(jobs) == sum(len(st["settings"][s].get("datasets") or st["datasets"]) for s in st["settings"]) \
            * len(st["methods"]) * len(st["seeds"])
        for job in jobs:
            spec = grid_cost.job_spec(tmp_path, config, study, job, tmp_path / "p.json", {}, 2, "cpu", 1)
            get_method(spec.method, spec.method_params)
            if spec.method == "gpaf":
                alpha = st["settings"][job["setting"]].get("params", {}).get("alpha", 1.0)
                assert spec.method_params["label_alpha"] == float(alpha)
            assert spec.train["rounds"] == 2


BENCH = Path(__file__).resolve().parents[1] / "bench"
MICRO = Path(__file__).resolve().parent / "fixtures" / "micro.yaml"


_scripts: list[ScriptRunner] = []  # started by the first script run, stopped after the file's last test


@pytest.fixture(scope="module", autouse=True)
def _script_runner():
    yield
    while _scripts:
        _scripts.pop().close()


def _run_script(script: Path, *args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python script ARGS`` in a process of its own, forked from one interpreter that imported torch once
    (``helpers/script_runner.py``): dozens of runs here, most of them refusals of a second or less."""
    if not _scripts:
        _scripts.append(ScriptRunner())
    return _scripts[0].run(script, *args, env=env, cwd=cwd, timeout=300)


def _bench(script: str, *args: str) -> subprocess.CompletedProcess:
    """A bench script run as the GPU session runs it, with this tree's package first on the path."""
    src = str(BENCH.parent / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    return _run_script(BENCH / script, *args, env=env)


def test_gpu_packing_times_its_jobs_end_to_end(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu", "--jobs", "1",
                  "--rounds", "2", "--threads", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["bench"] == "gpu_packing" and row["results"][0]["jobs"] == 1 and row["results"][0]["s_per_round"]


def test_grid_cost_data_has_the_official_split_sizes(tmp_path):
    """The timed job trains and evaluates on as many images as the real dataset has (not the demo's capped files)."""
    import grid_cost

    from fedmedbench.data.medmnist import dataset_info
    from fedmedbench.workflow import io

    config = grid_cost.load_config(BENCH.parent / "config" / "studies" / "earlystop.yaml")
    first = grid_cost.grid_jobs(config, "earlystop")[0]
    part, sources = grid_cost.make_data(tmp_path, config, "earlystop", first["setting"], first["dataset"])
    with np.load(sources["base"]) as arrays:
        sizes = {s: len(arrays[f"{s}_labels"]) for s in ("train", "val", "test")}
    want = dataset_info(first["dataset"]).n_samples
    assert sizes == want
    assert len(io.read_json(part)["clients"]) == config["studies"]["earlystop"]["settings"][first["setting"]]["num_clients"]


def test_round_persistence_names_no_commit_where_git_is_missing(monkeypatch, tmp_path):
    """Its row is written after the timed run: a machine without git must not lose it."""
    import round_persistence

    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable on the path
    monkeypatch.delenv("FMB_TREE", raising=False)
    assert round_persistence.git_head() == "?"
    monkeypatch.setenv("FMB_TREE", "abc1234:clean")  # a copy without .git: the sender's commit
    assert round_persistence.git_head() == "abc1234"


def test_grid_cost_sources_are_every_source_the_partition_reads(tmp_path):
    """GPAF's domain settings read one file per domain and, with the official holdout (the default), the
    clean official test split as ``base``: the timed job must be given all of them."""
    import grid_cost

    from fedmedbench.fl.data import FederatedData

    config = grid_cost.load_config(BENCH.parent / "config" / "studies" / "gpaf.yaml")
    first = grid_cost.grid_jobs(config, "gpaf")[0]
    part, sources = grid_cost.make_data(tmp_path, config, "gpaf", first["setting"], first["dataset"])
    assert set(sources) == {"clean", "midrange", "degraded", "base"}
    assert FederatedData(part, sources).num_clients == 3


def test_checkpoint_growth_times_a_checkpoint_that_holds_its_rounds_rows(tmp_path):
    """The checkpoint it times at round r resumes with r rounds of rows, and server.pt keeps one size."""
    import checkpoint_growth

    from fedmedbench.fl.state import checkpoint

    out = checkpoint_growth.save_cost(tmp_path, [1, 4], clients=5, model="cnn_small", repeats=1)
    assert [r["client_rows"] for r in out] == [5, 20]
    assert out[0]["server_pt_mb"] == out[1]["server_pt_mb"]
    resumed = checkpoint.load(tmp_path / "r4-0", "h")
    assert (resumed.rows, resumed.client_rows) == checkpoint_growth.rows_upto(4, 5)


def test_host_overhead_counts_ops_by_phase_and_leaves_views_out():
    import host_overhead
    import torch

    phases = host_overhead.Phases()
    a = torch.ones(4)

    def evaluate(x):
        return x.sum()  # 1 op, inside training below: counted as training

    def train(x):
        y = x * 2 + 1  # 2 ops
        y.view(2, 2)  # a view: no kernel
        return phases.wrap("eval", evaluate)(y)

    with host_overhead.CountOps(phases):
        phases.wrap("train", train)(a)
        torch.zeros(3)  # outside any phase
        phases.wrap("eval", evaluate)(a)
    assert (phases.ops["train"], phases.ops["eval"], phases.ops["other"]) == (3, 1, 1)
    assert phases.other_ops == {"aten.zeros": 1}
    assert [name for _, _, name in phases.intervals] == ["train", "eval"]  # the nested call is not a second interval


def test_host_overhead_takes_the_steady_rounds_less_their_training_and_evaluation():
    import host_overhead

    phases = host_overhead.Phases()
    phases.intervals = [(5.0, 12.0, "train"), (13.0, 15.0, "train"), (21.0, 30.0, "eval")]
    # round ends at 10, 20, 35 (an earlier boundary, the resident loop's first sync, is left out)
    assert host_overhead.steady_host_seconds(phases, [0.0, 10.0, 20.0, 35.0], rounds=3) == [10 - 4, 15 - 9]
    # the steady rounds (10 .. 35, two of them): 12.5 s each; training 10..12 and 13..15 (4 s) and
    # evaluation 21..30 (9 s) over the two; what falls before the first steady round is left out
    assert host_overhead.steady_phase_seconds(phases, [0.0, 10.0, 20.0, 35.0], rounds=3) == {
        "round": 12.5, "train": 2.0, "eval": 4.5}
    phases.marks = [(collections.Counter(train=5, other=9), collections.Counter(add=2)),
                    (collections.Counter(train=15, eval=4, other=19), collections.Counter(add=6, mul=4)),
                    (collections.Counter(train=25, eval=8, other=29), collections.Counter(add=10, mul=8))]
    per_phase, other = phases.steady_ops(rounds=3)
    assert per_phase == {"train": 10, "eval": 4, "other": 10} and other == {"add": 4, "mul": 4}


def test_data_speed_times_every_gpaf_domain_and_compares_the_medmnistc_chains():
    """Each default GPAF domain is timed; the MedMNIST-C chains also as bare medmnistc calls, which must
    give the images ``domains`` gives apart from its per-image seeding (the same chain, not another)."""
    import data_speed

    from fedmedbench.data import domains

    rows = data_speed.bench_corruptions(count=4)
    assert [r["domain"] for r in rows] == list(data_speed.CORRUPTION_DOMAINS)
    assert all(("ratio" in r) == r["domain"].endswith("_medmnistc") and r["ours_img_s"] > 0 for r in rows)
    flat = np.full((3, 28, 28), 128, np.uint8)
    spec = [{"corruption": "contrast", "range": [0.5, 0.5]}, {"corruption": "pixelate", "range": [0.5, 0.5]}]
    ours = domains.corrupt_images(flat, domains.build_steps("breastmnist", spec, "d"), 0, "d", "train")
    assert np.array_equal(data_speed._direct_medmnistc(flat, spec), ours)  # no randomness in these two


def test_gpu_wheels_asks_for_each_package_at_its_pinned_version(tmp_path):
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/bash\necho \"$*\" >> {tmp_path / 'args'}\n")
    fake.chmod(0o755)
    script = GPU_SESSION.parent / "gpu_wheels.sh"
    done = subprocess.run(["bash", str(script), str(tmp_path / "w"), "3.12"], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}, timeout=60)
    assert done.returncode == 0, done.stderr
    download, build = (tmp_path / "args").read_text().splitlines()
    args = download.split()
    pins = dict(a.split("==") for a in args if "==" in a)
    constraints = dict(line.split("==") for line in (GPU_SESSION.parents[1] / "envs" / "constraints.txt").read_text().split()
                       if "==" in line)
    assert {"flwr", "medmnist", "grpcio", "protobuf", "jsonschema"} <= set(pins)
    assert all(constraints[name] == version for name, version in pins.items())  # the project's own versions
    assert args[args.index("--python-version") + 1] == "3.12" and "--no-deps" in args
    # MedPy has no wheel on the index: its pinned source archive is built into one, without its dependencies
    assert build.split()[:3] == ["-m", "pip", "wheel"] and "--no-deps" in build.split()
    assert f"medpy=={constraints['medpy']}" in build.split()


def test_the_gpu_session_checks_for_every_package_the_project_imports_when_loaded():
    """Each module-level third-party import of the package is in gpu_session.sh's list of packages it checks
    for before any step (torch excepted: checked first, with its CUDA device): a package missing on the GPU
    machine stops the session at once, not a step minutes later (the fedst steps once failed on medpy)."""
    import ast
    import re

    src = GPU_SESSION.parents[1] / "src"
    direct: set[str] = set()
    for path in (src / "fedmedbench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                direct |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                direct.add(node.module.split(".")[0])
    probe = ("import importlib, pkgutil, sys, fedmedbench\n"
             "for m in pkgutil.walk_packages(fedmedbench.__path__, 'fedmedbench.'): importlib.import_module(m.name)\n"
             "print(' '.join(sorted({k.split('.')[0] for k in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(src)})
    assert done.returncode == 0, done.stderr
    loaded = (direct & set(done.stdout.split())) - set(sys.stdlib_module_names) - {"fedmedbench", "torch", "numpy"}
    listed = re.search(r"need = \[(.*?)\]", GPU_SESSION.read_text(), re.S)
    assert listed and "medpy" in loaded
    assert loaded <= set(re.findall(r'"([^"]+)"', listed.group(1)))


def test_waiting_steps_puts_back_cpu_batch_indices_and_blocking_batch_copies_then_lets_go():
    """The before side of a before/after: batch indices stay on the CPU and fedst's batches are copied with a
    blocking copy (non_blocking False); afterwards both go to the device without waiting again."""
    import torch
    from _timing import waiting_steps
    from torch.utils._python_dispatch import TorchDispatchMode

    from fedmedbench.fl import training
    from fedmedbench.fl.tasks.segmentation import training as segmentation

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.non_blocking: list[bool] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "_to_copy":
                self.non_blocking.append(bool((kwargs or {}).get("non_blocking", False)))
            return func(*args, **(kwargs or {}))

    def indices_and_copy() -> tuple[set[str], list[bool]]:
        idx = list(training.batch_indices(6, 4, 2, torch.Generator().manual_seed(0), "meta"))
        with Copies() as copies:
            segmentation.on_device(torch.zeros(2, 3), "meta")
        return {i.device.type for i in idx}, copies.non_blocking

    with waiting_steps():
        assert indices_and_copy() == ({"cpu"}, [False])
    assert indices_and_copy() == ({"meta"}, [True])


def test_flop_floor_counts_a_tiny_model_and_takes_a_share_of_the_peak():
    """FlopCounterMode's FLOPs of a hand-sized model (a matrix product is 2 x m x n x k), training = 3 x forward,
    and the floor's seconds, ratio and grid hours from hand-made figures."""
    import torch
    from _flop_floor import dense_peak, floor_fields, forward_flops, round_flops

    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, bias=False), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    assert forward_flops(model, torch.zeros(1, 2, 8, 8)) == 2 * (4 * 6 * 6 * 2 * 3 * 3) + 2 * (4 * 6 * 6 * 5)
    assert model.training  # left as it was
    assert round_flops(10.0, 4, 3) == 3 * 10 * 4 + 10 * 3
    fields = floor_fields(3e12, 100e12, 1.0, 36000)  # 3 TFLOP a round at 30 / 10 % of 100 TFLOP/s: 0.1 / 0.3 s
    assert fields["floor_s_per_round_30"] == pytest.approx(0.1) and fields["floor_s_per_round_10"] == pytest.approx(0.3)
    assert fields["measured_over_floor_30"] == 10.0 and fields["measured_over_floor_10"] == 3.33
    assert fields["floor_gpu_hours_30"] == 1.0 and fields["floor_gpu_hours_10"] == 3.0  # 36,000 rounds
    assert dense_peak("cuda", "NVIDIA H100 80GB HBM3") == (400e12, "DENSE_PEAK_TFLOPS[H100]")
    assert dense_peak("cuda", "NVIDIA H200", 500) == (500e12, "--peak-tflops")
    with pytest.raises(SystemExit, match="no dense peak known"):
        dense_peak("cuda", "Some Other Card")
    assert dense_peak("cpu", "cpu: x")[0] > 0  # a CPU's measured matrix-product rate


def test_grid_cost_work_of_an_earlystop_round_is_the_papers():
    """The paper's round: 10 of 100 clients x 5 local epochs over DermaMNIST's 7,007 training images (3,503.5
    samples), the 1,003 validation and 2,005 test images evaluated every round, ConvNeXtV2-nano at 64 px."""
    import tempfile

    import grid_cost

    config = grid_cost.load_config(STUDIES / "earlystop.yaml")
    first = grid_cost.grid_jobs(config, "earlystop")[0]
    with tempfile.TemporaryDirectory() as tmp:
        part, sources = grid_cost.make_data(Path(tmp), config, "earlystop", first["setting"], first["dataset"])
        spec = grid_cost.job_spec(Path(tmp), config, "earlystop", first, part, sources, 2, "cpu", 1)
        work = grid_cost.classification_work(config, "earlystop", first, part, spec)
    assert work["train_samples_per_round"] == pytest.approx(10 * 7007 / 100 * 5)
    assert work["eval_samples_per_round"] == 1003 + 2005
    assert 0.3e9 < work["forward_flops_per_sample"] < 0.5e9
    assert work["flops_per_round"] == pytest.approx(work["forward_flops_per_sample"] * (3 * 3503.5 + 3008))


def test_grid_cost_appends_each_studys_summary_with_its_floor_and_levers(tmp_path):
    results = tmp_path / "grid_cost_results.jsonl"
    for packing in ("1", "4"):
        done = _bench("grid_cost.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu", "--rounds", "2",
                      "--threads", "1", "--peak-tflops", "0.001", "--packing", packing, "--results", str(results),
                      "--methods", "fedavg")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "floor" in done.stdout.splitlines()[-1] and "micro:" in done.stdout.splitlines()[-1]
    one, packed = (json.loads(line) for line in results.read_text().splitlines())
    for row in (one, packed):
        assert row["study"] == "micro" and row["device"] == "cpu" and row["commit"] and row["dense_peak_tflops"] == 0.001
        assert row["floor_gpu_hours_30"] > 0 and row["floor_gpu_hours_10"] == pytest.approx(3 * row["floor_gpu_hours_30"], rel=0.02)
        assert row["measured_over_floor_30"] == pytest.approx(row["measured_s_per_round"] / row["floor_s_per_round_30"], rel=0.02)
        assert row["grid_gpu_hours"] == pytest.approx(row["device_hours"] / row["packing_throughput"], abs=0.1)
    assert one["levers"] == [] and packed["levers"] == ["packing=4"] and packed["packing_throughput"] == 4


def test_ops_per_round_counts_a_steady_round_whatever_the_width_and_image_side(tmp_path, monkeypatch):
    """bench/ops_per_round.py scales the model's widths and the image side down because the op count of a round
    does not depend on them: on a small earlystop-like workload (8 clients, 2 a round, 1 epoch of batch 16) the
    count is the same at two widths and two image sides, every op falls in a phase, and training dominates."""
    import engine_overhead as eo
    import ops_per_round
    import yaml

    monkeypatch.setattr(eo, "DERMA_COUNTS", {"train": 96, "val": 20, "test": 30})
    study = yaml.safe_load((STUDIES / "earlystop.yaml").read_text())["studies"]["earlystop"]
    study["settings"]["dir0.1"]["num_clients"] = 8
    study.update(clients_per_round=2, train={**study["train"], "local_epochs": 1, "batch_size": 16,
                                             "eval_batch_size": 16})
    config = tmp_path / "earlystop.yaml"
    config.write_text(yaml.safe_dump({"studies": {"earlystop": study}}))
    rows = [ops_per_round.count_round("earlystop", "fedavg", config, width, size, 1, tmp_path / f"w{width}-{size}")
            for width, size in ((2, 32), (4, 32), (2, 48))]
    counts = {row["ops_per_round"] for row in rows}
    assert len(counts) == 1 and rows[0]["ops_per_round"] == sum(rows[0]["ops"].values())
    assert rows[0]["ops"]["train"] > rows[0]["ops"]["eval"] > 0 and rows[0]["clients_per_round"] == 2


def test_packed_surgical_jobs_are_the_grid_timings_jobs(tmp_path):
    """bench/gpu_packing.py --study fedst|ultraflwr: each packed job is the job grid_cost.py times (fedst: the main
    variant with its clip cache scaled by the stand-in's fraction; the config's loading unless --image-cache)."""
    import argparse

    import gpu_packing

    surgical = tmp_path / "si"
    (surgical / "clips").mkdir(parents=True)
    (surgical / "stand_in.json").write_text(json.dumps({"fraction": 0.25, "test_fraction": 0.1, "distinct_frames": 8}))
    root = Path(__file__).resolve().parents[1]
    args = argparse.Namespace(config=root / "config" / "studies" / "fedst.yaml", study="fedst", method="fedst",
                              rounds=3, surgical_dir=surgical, surgical_epochs=2, surgical_steps=None, image_cache=None, device="cpu",
                              threads=2, workdir=tmp_path / "w", index=5)
    spec = gpu_packing.fedst_spec(args)
    assert spec.method == "fedst" and spec.task_params["cache_mb"] == 1024  # 4096 x 0.25
    assert spec.loader_workers == 4 and spec.image_cache == "resources/cache/clips"
    assert spec.run_dir == str(tmp_path / "w" / "job5") and spec.train["rounds"] == 3
    spec = gpu_packing.fedst_spec(argparse.Namespace(**{**vars(args), "image_cache": tmp_path / "store"}))
    assert spec.image_cache == str(tmp_path / "store")


@pytest.mark.parametrize(("option", "named"), [(["--study", "nosuch"], "--study nosuch"),
                                               (["--study", "micro", "--method", "nosuch"], "--method nosuch")])
def test_gpu_packing_refuses_a_study_or_method_the_config_lacks_in_one_line(option, named, tmp_path):
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--device", "cpu", "--jobs", "1", "--rounds", "1",
                  *option)
    assert done.returncode != 0
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_grid_cost_refuses_a_study_no_config_has_in_one_line(tmp_path):
    """A misspelt --study times nothing: one line naming it and the config's studies, not a silent exit 0."""
    done = _bench("grid_cost.py", "--config", str(MICRO), "--device", "cpu", "--study", "micro", "nosuch",
                  "--results", str(tmp_path / "rows.jsonl"))
    assert done.returncode != 0
    assert "--study nosuch" in done.stderr and "micro" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize("option", [["--assd", "nosuch"], ["--device", "nosuch"]])
def test_segmetrics_device_refuses_an_unknown_assd_rule_or_device_before_scoring(option):
    done = _bench("segmetrics_device.py", "--frames", "1", "--size", "32", *option)
    assert done.returncode == 2 and option[0] in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_gpu_packing_names_the_missing_export_of_a_surgical_study_in_one_line(tmp_path):
    """A --surgical-dir whose yolo/ folder lacks the first group's export stops before any job, naming the file."""
    (tmp_path / "yolo").mkdir()
    done = _bench("gpu_packing.py", "--config", str(STUDIES / "ultraflwr.yaml"), "--study", "ultraflwr", "--device",
                  "cpu", "--method", "FedAvg", "--jobs", "1", "--surgical-dir", str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{tmp_path}/yolo/combined/a/manifest.json is missing" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--study", "ultraflwr", "--device", "cpu", "--jobs", "1",
                  "--surgical-dir", str(tmp_path))
    assert done.returncode == 1 and "no ultraflwr.groups" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_bench_config_with_a_value_of_the_wrong_type_is_one_line_naming_file_and_key(tmp_path):
    """grid_cost.py and gpu_packing.py read their --config as the workflow does: a bad value or YAML is one line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text((STUDIES / "earlystop.yaml").read_text().replace("train_gpu_mem_mb: 10000", 'train_gpu_mem_mb: "ten"'))
    for script in ("grid_cost.py", "gpu_packing.py"):
        done = _bench(script, "--config", str(bad), "--device", "cpu")
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == f"config error in {bad} at 'resources.train_gpu_mem_mb': 'ten' is not of type " \
                                      "'integer', 'null'"
    bad.write_text("studies: [\n")
    done = _bench("grid_cost.py", "--config", str(bad), "--device", "cpu")
    assert done.returncode == 1 and done.stderr.startswith(f"{bad}:2:1:") and "Traceback" not in done.stderr


def test_gpu_packing_keeps_the_counts_before_one_whose_jobs_fail(tmp_path, monkeypatch, capsys):
    """A count whose jobs fail (16 jobs out of GPU memory) ends the bench with one line, and the row it still
    writes holds the counts measured before it; no later count is started."""
    import gpu_packing

    started = []

    def run_jobs(n, *_):
        started.append(n)
        if n == 2:
            return {"jobs": 2, "failed_exit_codes": [0, 1], "wall_s": 1.0}
        return {"jobs": 1, "s_per_round": [2.0], "mean_s_per_round": 2.0, "rounds_per_s": 0.5, "wall_s": 3.0,
                "peak_reserved_mib": 0}

    monkeypatch.setattr(gpu_packing, "run_jobs", run_jobs)
    out = tmp_path / "rows.jsonl"
    monkeypatch.setattr(sys, "argv", ["gpu_packing.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu",
                                      "--jobs", "1", "2", "4", "--out", str(out)])
    with pytest.raises(SystemExit) as stop:
        gpu_packing.main()
    assert "2 jobs: a job failed (exit codes [0, 1]" in str(stop.value.code) and started == [1, 2]
    results = json.loads(out.read_text())["results"]
    assert results[0]["throughput_vs_one"] == 1.0 and results[1] == {"jobs": 2, "failed_exit_codes": [0, 1],
                                                                     "wall_s": 1.0}


def test_a_jobs_seconds_a_round_leave_out_the_first_round_when_there_are_more():
    from _timing import steady_s_per_round

    assert steady_s_per_round([9.0, 1.0, 2.0]) == 1.5 and steady_s_per_round([4.0]) == 4.0


def test_grid_cost_refuses_a_method_no_costed_study_has_in_one_line(tmp_path):
    """A misspelt --methods name would time the study's first method in its place: one line instead."""
    done = _bench("grid_cost.py", "--config", str(MICRO), "--device", "cpu", "--methods", "fedavg", "fedsgd",
                  "--results", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("grid_cost: --methods fedsgd: not a method of the studies costed (")
    assert not (tmp_path / "rows.jsonl").exists()


def test_grid_cost_knows_each_studys_timeable_names():
    import grid_cost

    for name, study, member in (("earlystop.yaml", "earlystop", "fedwmsam"), ("ultraflwr.yaml", "ultraflwr", "FedAvg"),
                                ("fedst.yaml", "fedst", "seg_fedavg")):
        config = grid_cost.load_config(STUDIES / name)
        assert study in grid_cost.costed_studies(config) and member in grid_cost.timeable_methods(config, study)


def test_grid_cost_checks_every_studys_setting_before_timing_the_first(tmp_path):
    """gpaf.yaml's two studies: a --setting only the first has stops the run before anything is timed."""
    import grid_cost

    config = grid_cost.load_config(STUDIES / "gpaf.yaml")
    first, second = list(config["studies"])[:2]
    only_first = sorted({j["setting"] for j in grid_cost.grid_jobs(config, first)}
                        - {j["setting"] for j in grid_cost.grid_jobs(config, second)})[0]
    done = _bench("grid_cost.py", "--config", str(STUDIES / "gpaf.yaml"), "--device", "cpu", "--setting", only_first,
                  "--results", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 1 and f"grid_cost: --setting {only_first}: no such setting" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "job " not in done.stderr  # nothing timed


@pytest.mark.parametrize("option", [["--jobs", "1", "0"], ["--rounds", "0"], ["--jobs", "two"]])
def test_gpu_packing_takes_job_and_round_counts_from_one(option):
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu", *option)
    assert done.returncode == 2 and "is not a whole number from 1" in done.stderr and "Traceback" not in done.stderr


def test_a_torch_profile_is_written_whole_with_its_ops_by_host_time(blood_dir, tmp_path):
    """grid_cost --torch-profile: the engine run's ops table lands in the file through a temp file (none left)."""
    from engine_overhead import torch_profile_engine
    from test_device_arrays import make_spec

    out = tmp_path / "profile.txt"
    torch_profile_engine(make_spec(blood_dir, "fedavg", "profiled"), out)
    assert "Self CPU" in out.read_text() and [p.name for p in tmp_path.iterdir()] == ["profile.txt"]


def test_gpu_packing_refuses_batch_clients_for_a_surgical_study_in_one_line(tmp_path):
    """--[no-]batch-clients is a MedMNIST train key: for ultraflwr or fedst it would be silently ignored."""
    for study, option in (("ultraflwr", ["--no-batch-clients"]), ("fedst", ["--runs-together", "2"])):
        done = _bench("gpu_packing.py", "--config", str(STUDIES / f"{study}.yaml"), "--study", study, "--device", "cpu",
                      "--jobs", "1", "--surgical-dir", str(tmp_path), *option)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == ("gpu_packing: --[no-]batch-clients and --runs-together apply to the MedMNIST "
                                       f"studies, not {study}")


def _micro_without_buffers(tmp_path: Path) -> Path:
    """The micro study on a model without buffers, whose seeds can share their rounds (the small CNN's batch
    statistics would have each run timed alone): timm's 0.1 M-parameter test EfficientNet with group norm, at the
    micro's 28 px (a ConvNeXtV2-atto needs 64 px and 3.4 M parameters: minutes of training on the CPU)."""
    import yaml

    config = yaml.safe_load(MICRO.read_text())
    config["studies"]["micro"].update(model={"name": "timm:test_efficientnet_gn"})
    (tmp_path / "micro.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "micro.yaml"


def test_gpu_packing_runs_each_jobs_seeds_side_by_side(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = _bench("gpu_packing.py", "--config", str(_micro_without_buffers(tmp_path)), "--study", "micro", "--device",
                  "cpu", "--jobs", "1", "--rounds", "2", "--threads", "1", "--batch-clients", "--runs-together", "2",
                  "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot share its rounds" not in done.stderr, done.stderr
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["runs_together"] == 2 and row["results"][0]["jobs"] == 1 and row["results"][0]["s_per_round"]
    assert "timed_alone" not in row["results"][0]


def test_gpu_packing_names_jobs_timed_alone_where_their_seeds_cannot_share_rounds(tmp_path):
    """The small CNN has batch statistics: each process's runs were timed one by one while the row read as side by
    side; now each count's result says so, and why."""
    out = tmp_path / "rows.jsonl"
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu", "--jobs", "1",
                  "--rounds", "2", "--threads", "1", "--batch-clients", "--runs-together", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text().splitlines()[-1])["results"][0]
    assert "buffers" in result["timed_alone"], result


def test_ultraflwr_timings_run_two_to_the_configs_local_epochs():
    from _surgical_cost import timed_epochs

    config = {"ultraflwr": {"train": {"epochs": 20}}}
    assert [timed_epochs(config, e) for e in (0, 1, 2, 5, 20, 40)] == [2, 2, 2, 5, 20, 20]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_yolo_read_ahead_refuses_cuda_without_a_device_in_one_line(tmp_path):
    done = _bench("yolo_read_ahead.py", "--surgical-dir", str(tmp_path), "--device", "cuda")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "yolo_read_ahead: --device cuda, but torch sees no CUDA device"


def test_grid_cost_times_a_job_side_by_side_with_its_other_seeds_at_its_share_of_the_wall_time(tmp_path, monkeypatch):
    """--runs-together N: the job's seeds 0..N-1 run side by side, each in its own folder, and a job's seconds a round
    are the round's wall time over N; alone, the job's own timing."""
    import grid_cost

    from fedmedbench.fl.spec import RunSpec

    seen: list[list[tuple[int, str]]] = []

    def together(specs):
        seen.append([(s.seed, s.run_dir) for s in specs])
        return [6.0, 3.0, 3.3]

    monkeypatch.setattr(grid_cost, "time_specs_together", together)
    monkeypatch.setattr(grid_cost, "time_spec", lambda spec: [5.0, 1.0, 1.1])
    monkeypatch.setattr(grid_cost, "side_by_side_why_not", lambda spec: None)  # a job whose rounds can be shared
    spec = RunSpec(run_dir=str(tmp_path / "run-fedavg"), study="s", dataset="d", setting="x", method="fedavg", seed=0,
                   partition_path="p.json", sources={}, image_size=28, train={"batch_clients": True})
    assert grid_cost.job_seconds_a_round(spec, 3) == pytest.approx([2.0, 1.0, 1.1])
    assert seen == [[(i, f"{tmp_path}/run-fedavg-seed{i}") for i in range(3)]]
    assert grid_cost.job_seconds_a_round(spec, 1) == [5.0, 1.0, 1.1]


def test_grid_cost_times_a_job_alone_where_its_runs_side_by_side_would_take_turns(tmp_path, monkeypatch):
    """Without train.batch_clients, or with a model or method whose clients train one by one, runs side by side
    withdraw and take turns, each round timed as alone: their wall time over N would be N times too small a cost,
    so such a job is timed alone (its cost side by side), never divided."""
    import grid_cost
    from test_clients_together import spec as together_spec
    from test_clients_together import write_data

    from fedmedbench.fl.spec import RunSpec

    monkeypatch.setattr(grid_cost, "time_specs_together", lambda specs: [6.0, 3.0, 3.3])
    monkeypatch.setattr(grid_cost, "time_spec", lambda spec: [5.0, 1.0, 1.1])
    spec = RunSpec(run_dir=str(tmp_path / "run-fedavg"), study="s", dataset="d", setting="x", method="fedavg", seed=0,
                   partition_path="p.json", sources={}, image_size=28, train={"batch_clients": False})
    assert grid_cost.job_seconds_a_round(spec, 3) == [5.0, 1.0, 1.1]
    d = write_data(tmp_path, 28, 200)
    assert "buffers" in grid_cost.side_by_side_why_not(together_spec(d, "bn", model="cnn_small", batch_clients=True))
    assert grid_cost.side_by_side_why_not(together_spec(d, "ln", batch_clients=True)) is None


def test_grid_cost_runs_seeds_side_by_side_end_to_end_and_names_the_lever(tmp_path):
    """On a model without buffers, whose runs share their rounds (the small CNN's would be timed alone)."""
    results = tmp_path / "grid_cost_results.jsonl"
    done = _bench("grid_cost.py", "--config", str(_micro_without_buffers(tmp_path)), "--study", "micro", "--device", "cpu",
                  "--rounds", "2", "--threads", "1", "--runs-together", "2", "--batch-clients", "--results", str(results),
                  "--methods", "fedavg")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot share its rounds" not in done.stderr, done.stderr
    row = json.loads(results.read_text().splitlines()[-1])
    assert "runs_together=2" in row["levers"]
    bad = _bench("grid_cost.py", "--config", str(MICRO), "--runs-together", "0")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == "grid_cost: --runs-together 0: give 1 or more runs"


def test_grid_cost_names_a_job_timed_alone_and_claims_no_side_by_side_lever(tmp_path):
    """--runs-together where the runs cannot share their rounds (no batch_clients) times each job alone: the row named
    runs_together=2 among its levers as if the seeds had shared them; now it names the job timed alone and why."""
    out, results = tmp_path / "rows.jsonl", tmp_path / "grid_cost_results.jsonl"
    done = _bench("grid_cost.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu", "--rounds", "2",
                  "--threads", "1", "--runs-together", "2", "--no-batch-clients", "--out", str(out),
                  "--results", str(results), "--methods", "fedavg")
    assert done.returncode == 0, done.stdout + done.stderr
    row, summary = (json.loads(p.read_text().splitlines()[-1]) for p in (out, results))
    assert row["timed_alone"] == {"fedavg": "train.batch_clients is off"}
    assert not any(lever.startswith("runs_together") for lever in summary["levers"]), summary["levers"]


def test_seeds_side_by_side_counts_fewer_ops_a_job_round_than_alone_and_the_same_weights(tmp_path):
    """bench/seeds_side_by_side.py on a 2-wide ConvNeXtV2 at 32 px: two seeds side by side launch fewer ATen ops a
    job-round than one alone (their training is one call) and end on the same weights to float32 rounding."""
    out = tmp_path / "rows.jsonl"
    done = _bench("seeds_side_by_side.py", "--seeds", "2", "--rounds", "2", "--width", "2", "--image-size", "32",
                  "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["bench"] == "seeds_side_by_side" and row["seeds"] == 2 and row["max_weight_difference"] <= 1e-4
    assert 0 < row["ops_per_job_round_side_by_side"] < 0.8 * row["ops_per_job_round_alone"]
    assert row["alone_s_per_round"] > 0 and row["side_by_side_s_per_job_round"] > 0


def test_gpu_packing_takes_threads_from_one_before_any_job_starts():
    """--threads 0 would stop every job in its own traceback (torch takes no 0 threads): one line instead."""
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu", "--threads", "0")
    assert done.returncode == 2 and "--threads: '0' is not a whole number from 1" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("option", [["--width", "0"], ["--image-size", "0"], ["--threads", "0"]])
def test_seeds_side_by_side_refuses_a_zero_size_in_one_line(option):
    done = _bench("seeds_side_by_side.py", "--seeds", "2", "--rounds", "2", *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "seeds_side_by_side: give --width, --image-size and --threads of 1 or more"


@pytest.mark.parametrize(("option", "line"), [(["--rounds", "0"], "--rounds: '0' is not a whole number from 1"),
                                              (["--packing", "0"], "grid_cost: --packing 0: give a throughput above 0"),
                                              (["--packing", "nan"], "grid_cost: --packing nan: give a throughput above 0"),
                                              (["--batch-padding", "0.9"],
                                               "grid_cost: --batch-padding 0.9: give 1 or more (inf: one call a step)")])
def test_grid_cost_refuses_zero_rounds_or_packing_in_one_line(option, line, tmp_path):
    """--rounds 0 timed nothing and failed reading an empty metrics file; --packing 0 divided by zero at the end, and
    --packing nan wrote a row of NaN GPU-hours."""
    done = _bench("grid_cost.py", "--config", str(MICRO), "--study", "micro", "--device", "cpu",
                  "--results", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert line in done.stderr.strip().splitlines()[-1] and not (tmp_path / "rows.jsonl").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_grid_cost_refuses_cuda_without_a_device_in_one_line():
    done = _bench("grid_cost.py", "--config", str(MICRO), "--study", "micro", "--device", "cuda")
    assert done.returncode == 1 and done.stderr.strip() == "grid_cost: --device cuda, but torch sees no CUDA device"


def test_a_result_line_is_added_whole_or_not_at_all(tmp_path):
    """bench/_report.py's append_lines (every bench's --out, grid_cost's summary rows): a process killed while writing
    leaves the file as it was; a file whose last line lacks its newline gets one before the new line."""
    from _report import append_lines

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}')
    append_lines(rows, ['{"b": 2}'])
    assert rows.read_text() == '{"a": 1}\n{"b": 2}\n' and [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'bench')!r}); " \
           f"from _report import append_lines; append_lines({str(rows)!r}, ['{{\"c\": 3}}'])"
    killed = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FEDMEDBENCH_FAULT_KILL_BEFORE_RENAME": "*rows.jsonl"},
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9 and rows.read_text() == '{"a": 1}\n{"b": 2}\n'


def test_gpu_packing_refuses_an_unknown_device_before_any_job_starts():
    done = _bench("gpu_packing.py", "--config", str(MICRO), "--study", "micro", "--device", "gpu", "--jobs", "1")
    assert done.returncode == 2 and "--device: invalid choice: 'gpu'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("config", "option", "line"), [
    ("fedst", ["--autocast", "bf16"], "--autocast applies to the MedMNIST studies only, not fedst"),
    ("ultraflwr", ["--setting", "qty0.01", "--runs-together", "2"],
     "--setting and --runs-together apply to the MedMNIST studies only, not ultraflwr"),
    ("ultraflwr", ["--no-batch-clients"], "--[no-]batch-clients applies to the MedMNIST studies only, not ultraflwr"),
    ("fedst", ["--scale-by", "dermamnist/dir0.01"], "--scale-by applies"),
    ("fedst", ["--torch-profile", "p.txt"], "--torch-profile applies"),
    ("fedst", ["--batch-padding", "inf"], "--batch-padding applies"),
])
def test_grid_cost_refuses_a_medmnist_option_where_a_surgical_study_is_costed_in_one_line(config, option, line, tmp_path):
    """The surgical studies' timings take none of these: their rows were timed without them, silently."""
    done = _bench("grid_cost.py", "--config", str(STUDIES / f"{config}.yaml"), "--device", "cpu",
                  "--surgical-dir", str(tmp_path), "--results", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and line in done.stderr, done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


def test_grid_cost_leaves_the_surgical_study_out_with_study_and_takes_the_option(tmp_path):
    """A config with both kinds: --study naming only the MedMNIST ones lets the option through."""
    args = SimpleNamespace(setting=None, scale_by=None, autocast="bf16", torch_profile=None, batch_clients=None,
                           runs_together=1, batch_padding=None, one_pair=False)
    import grid_cost

    configs = {STUDIES / "fedst.yaml": grid_cost.load_config(STUDIES / "fedst.yaml"),
               MICRO: grid_cost.load_config(MICRO)}
    grid_cost.check_medmnist_options(configs, ["micro"], args)  # no exit
    with pytest.raises(SystemExit):
        grid_cost.check_medmnist_options(configs, None, args)
    grid_cost.check_medmnist_options(configs, None, SimpleNamespace(**{**vars(args), "autocast": None}))


def test_the_side_by_side_timing_trains_both_seeds_rounds_in_one_call(tmp_path, monkeypatch):
    """What --runs-together times is the runs sharing their rounds: every batched call holds both seeds' clients
    (were they taking turns, each call would hold one run's), and each seed writes its own rows."""
    import _timing
    from test_clients_together import spec as together_spec
    from test_clients_together import write_data

    from fedmedbench.fl.methods import _together

    sizes: list[int] = []
    plain = _together.train_together

    def counted(ctxs, hooks, each_own_error=False):
        sizes.append(len(ctxs))
        return plain(ctxs, hooks, each_own_error)

    monkeypatch.setattr(_together, "train_together", counted)
    d = write_data(tmp_path, 28, 200)
    spec = together_spec(d, "run", batch_clients=True, rounds=2)
    specs = [dataclasses.replace(spec, seed=seed, run_dir=f"{spec.run_dir}-seed{seed}") for seed in range(2)]
    seconds = _timing.time_specs_together(specs, log=lambda m: None)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    assert sizes == [2 * spec.clients_per_round] * 2, sizes  # one call a round, both runs' four clients
    assert all((Path(s.run_dir) / "metrics.csv").exists() for s in specs)


@pytest.mark.parametrize(("script", "option"), [
    ("engine_overhead.py", "--repeats"), ("engine_overhead.py", "--rounds"), ("host_overhead.py", "--repeats"),
    ("tracking_cost.py", "--repeats"), ("segmetrics_device.py", "--batch"), ("segmetrics_device.py", "--repeats"),
    ("segmetrics_device.py", "--frames"), ("yolo_loading.py", "--samples"), ("yolo_read_ahead.py", "--epochs"),
    ("clip_loading.py", "--steps"), ("disk_per_job.py", "--clients"), ("ops_per_round.py", "--image-size"),
])
def test_a_bench_takes_its_counts_from_one_in_one_line(script, option, tmp_path):
    """0 repeats, rounds, steps or samples ended in a traceback (min() of nothing, a division by zero, an empty
    metrics file) or, for segmetrics_device's --repeats, a row with an infinite time: one line naming the option."""
    surgical = ["--surgical-dir", str(tmp_path)] if script.startswith("yolo_") else []
    clips = ["--clips", str(tmp_path)] if script == "clip_loading.py" else []
    done = _bench(script, *surgical, *clips, option, "0", "--out", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"argument {option}: '0' is not a whole number from 1" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without CUDA")
@pytest.mark.parametrize("script", ["engine_overhead.py", "host_overhead.py", "segmetrics_device.py"])
def test_a_bench_refuses_cuda_without_a_device_in_one_line(script, tmp_path):
    done = _bench(script, "--device", "cuda", "--out", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"{script.removesuffix('.py')}: --device cuda, but torch sees no CUDA device"
    assert not (tmp_path / "rows.jsonl").exists()


def test_a_result_file_that_is_a_folder_is_named_in_one_line(tmp_path):
    """--out or --results naming a folder ended a finished timing in an IsADirectoryError traceback."""
    from _report import append_lines

    line = f"{tmp_path}: a folder, not a JSON-lines file (the rows are printed above)"
    with pytest.raises(SystemExit, match=f"^{re.escape(line)}$"):
        append_lines(tmp_path, ['{"a": 1}'])
    assert list(tmp_path.iterdir()) == []


def test_demo_breakdown_adds_its_rows_whole_or_not_at_all(tmp_path):
    """--out went through open('a'): a run stopped while writing left a half line, and a file without its last newline
    had the first row glued to it."""
    bench = tmp_path / "benchmarks"
    for rule, seconds in (("train", 12.5), ("report", 1.5)):
        (bench / rule).mkdir(parents=True)
        (bench / rule / "job.tsv").write_text(f"s\tcpu_time\tmax_rss\n{seconds}\t{seconds / 2}\t100\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}')
    done = _bench("demo_breakdown.py", "--benchmarks", str(bench), "--out", str(rows))
    assert done.returncode == 0, done.stderr
    lines = rows.read_text().splitlines()
    assert lines[0] == '{"a": 1}' and [json.loads(x)["rule"] for x in lines[1:]] == ["train", "report"]
    before = rows.read_text()
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent / "src"), "FEDMEDBENCH_FAULT_KILL_BEFORE_RENAME": "*rows.jsonl"}
    killed = subprocess.run([sys.executable, str(BENCH / "demo_breakdown.py"), "--benchmarks", str(bench), "--out",
                             str(rows)], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9 and rows.read_text() == before


@pytest.mark.parametrize(("study", "option", "line"), [
    ("micro", ["--surgical-dir", "."], "--surgical-dir applies to the surgical studies (ultraflwr, fedst) only, not micro"),
    ("micro", ["--image-cache", "c", "--surgical-epochs", "3"],
     "--surgical-epochs and --image-cache apply to the surgical studies (ultraflwr, fedst) only, not micro"),
    ("fedst", ["--surgical-epochs", "3"], "--surgical-epochs applies to ultraflwr only, not fedst"),
    ("ultraflwr", ["--surgical-steps", "20"], "--surgical-steps applies to fedst only, not ultraflwr"),
])
def test_gpu_packing_refuses_a_surgical_option_for_a_study_that_ignores_it_in_one_line(study, option, line, tmp_path):
    """A MedMNIST study's jobs read no --surgical-dir, --surgical-epochs or --image-cache, fedst's no --surgical-epochs:
    the row was timed without them, silently."""
    config = MICRO if study == "micro" else STUDIES / f"{study}.yaml"
    done = _bench("gpu_packing.py", "--config", str(config), "--study", study, "--device", "cpu", "--jobs", "1",
                  "--out", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"gpu_packing: {line}"
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("option", "line"), [
    (["--model", "cnn_small", "--study-config", "config/studies/earlystop.yaml"],
     "engine_overhead: --model with --study-config: the model is the study's (give one of them)"),
    (["--study", "gpaf"], "engine_overhead: --study names a study of --study-config, and none is given"),
    (["--study-config", "nosuch.yaml"], "nosuch.yaml: no such study config"),
    (["--study-config", str(MICRO), "--study", "nosuch"], f"{MICRO}: no study 'nosuch' (its studies: micro)"),
    (["--clients", "4", "--per-round", "8"], "engine_overhead: --per-round 8: more than --clients 4"),
])
def test_engine_overhead_refuses_a_model_study_or_sample_it_cannot_use_in_one_line(option, line, tmp_path):
    """--model was silently replaced by the study config's model and --study silently ignored without a study config;
    a missing config or study, or more clients a round than clients, was a traceback."""
    done = _bench("engine_overhead.py", "--rounds", "1", "--out", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == line
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("option", "line"), [
    (["--method", "nosuch"], "ops_per_round: --method nosuch: not one of "),
    (["--config", "nosuch.yaml"], "nosuch.yaml: no such study config"),
    (["--width", "-1"], "argument --width: -1: give 0 (the real model) or a width from 1"),
])
def test_ops_per_round_refuses_an_unknown_method_a_missing_config_or_a_negative_width_in_one_line(option, line,
                                                                                                   tmp_path):
    done = _bench("ops_per_round.py", "--image-size", "8", "--out", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert line in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("option", "line"), [
    (["--surgical-dir", ".", "--method", "fedavg", "--rounds", "3"],
     "disk_per_job: --method and --rounds apply to the MedMNIST job, not the ultraflwr job of --surgical-dir"),
    (["--image-cache", "c"], "disk_per_job: --image-cache applies to the ultraflwr job only: give --surgical-dir"),
    (["--method", "nosuch"], "disk_per_job: --method nosuch: no such method ("),
])
def test_disk_per_job_refuses_an_option_its_job_ignores_or_an_unknown_method_in_one_line(option, line, tmp_path):
    """--method, --model, --clients and --rounds were silently dropped with --surgical-dir, --config and --image-cache
    without it; an unknown method was a traceback from the engine."""
    done = _bench("disk_per_job.py", "--out", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith(line), done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("option", "line"), [
    (["--width", "-1"], "argument --width: -1: give 0 (the real model) or a width from 1"),
    (["--study-config", "nosuch.yaml", "--image-size", "8"], "nosuch.yaml: no such study config"),
])
def test_host_overhead_refuses_a_negative_width_or_a_missing_study_config_in_one_line(option, line, tmp_path):
    done = _bench("host_overhead.py", "--rounds", "2", "--out", str(tmp_path / "rows.jsonl"), *option)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert line in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("option", "line"), [
    (["--site", "A", "Z"], "clip_loading: --site Z: no {clips}/Z/clips.parquet (--clips holds A)"),
    (["--site", "--server", "Z"], "clip_loading: --server Z: no {clips}/Z/clips.parquet (--clips holds A)"),
    (["--workers", "0", "-1"], "clip_loading: --workers -1: give 0 (decode in the loop) or more threads"),
    (["--compute-ms", "-5"], "clip_loading: --compute-ms -5: give 0 or more milliseconds"),
    (["--site", "--server", "A", "--metrics"], "clip_loading: --metrics times the --site sites, and none is given"),
])
def test_clip_loading_refuses_a_site_without_clips_or_a_negative_count_before_timing_in_one_line(option, line,
                                                                                               tmp_path):
    """A site without clips stopped the bench in a traceback after the sites before it were timed (their rows lost);
    a negative thread count or wait failed part way through; --metrics or --image-cache without a site timed nothing."""
    clips = tmp_path / "clips"
    (clips / "A").mkdir(parents=True)
    (clips / "A" / "clips.parquet").write_text("")  # never read: the check comes before any timing
    done = _bench("clip_loading.py", "--clips", str(clips), "--steps", "1", "--out", str(tmp_path / "rows.jsonl"),
                  *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == line.format(clips=clips)
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize("script", ["yolo_loading.py", "yolo_read_ahead.py"])
def test_a_yolo_bench_refuses_a_client_the_export_lacks_in_one_line(script, tmp_path):
    manifest = tmp_path / "yolo" / "combined" / "a" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"classes": ["tool"], "pooled": {}, "clients": [{"client": 0}, {"client": 1}]}))
    device = ["--device", "cpu"] if script == "yolo_read_ahead.py" else []
    done = _bench(script, "--surgical-dir", str(tmp_path), "--client", "5", *device, "--out", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"--client 5: not a client of {manifest} (0, 1)"
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("option", "line"), [
    (["--size", "100"], "argument --size: 100: give a multiple of 32"),
    (["--size", "16"], "argument --size: 16: give a multiple of 32"),
    (["--numpy-frames", "3"], "argument --numpy-frames: 3: give at most --frames (2)"),
    (["--noise", "-0.1"], "argument --noise: -0.1: give a share of the pixels from 0 to 1"),
])
def test_segmetrics_device_refuses_frames_it_cannot_draw_or_score_as_named(option, line, tmp_path):
    """--size 100 scored 96 px frames and --size 16 empty ones, each row naming the size asked for; --numpy-frames above
    --frames named more frames than were scored; --noise -0.1 relabelled no pixel."""
    done = _bench("segmetrics_device.py", "--frames", "2", "--device", "cpu", "--out", str(tmp_path / "rows.jsonl"),
                  *option)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert line in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("script", "option", "value", "line"), [
    ("engine_overhead.py", "--local-epochs", "-1", "argument --local-epochs: '-1' is not a number above 0"),
    ("host_overhead.py", "--local-epochs", "0", "argument --local-epochs: '0' is not a number above 0"),
    ("grid_cost.py", "--peak-tflops", "0", "argument --peak-tflops: '0' is not a number above 0"),
    ("grid_cost.py", "--threads", "0", "argument --threads: '0' is not a whole number from 1"),
])
def test_a_bench_refuses_a_value_it_would_not_use_as_given_in_one_line(script, option, value, line, tmp_path):
    """engine_overhead trained one step a client and wrote local_epochs -1; grid_cost took --peak-tflops 0 as
    not given (the CPU's measured rate instead) and --threads 0 as 1, each row naming the value given."""
    done = _bench(script, option, value, "--out", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert line in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(("config", "option", "line"), [
    ("micro", ["--surgical-dir", "."], "--surgical-dir applies to fedst or ultraflwr only, not micro (costed here)"),
    ("micro", ["--no-image-cache", "--loader-workers", "2"],
     "--no-image-cache and --loader-workers apply to fedst or ultraflwr only, not micro (costed here)"),
    ("fedst", ["--surgical-epochs", "3"], "--surgical-epochs applies to ultraflwr only, not fedst (costed here)"),
    ("fedst", ["--yolo-workers", "4"], "--yolo-workers applies to ultraflwr only, not fedst (costed here)"),
    ("ultraflwr", ["--surgical-steps", "20"], "--surgical-steps applies to fedst only, not ultraflwr (costed here)"),
])
def test_grid_cost_refuses_a_surgical_option_no_costed_study_takes_in_one_line(config, option, line, tmp_path):
    """The MedMNIST timings read none of these, fedst's no YOLO epochs or workers: the rows were timed without them."""
    path = MICRO if config == "micro" else STUDIES / f"{config}.yaml"
    done = _bench("grid_cost.py", "--config", str(path), "--device", "cpu", "--results", str(tmp_path / "rows.jsonl"),
                  *option)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"grid_cost: {line}"
    assert not (tmp_path / "rows.jsonl").exists()


def test_grid_cost_takes_a_surgical_option_where_a_costed_study_takes_it(tmp_path):
    """With both kinds costed, an option of the surgical studies passes the check; --study leaving them out refuses it."""
    import grid_cost

    configs = {STUDIES / "ultraflwr.yaml": grid_cost.load_config(STUDIES / "ultraflwr.yaml"),
               MICRO: grid_cost.load_config(MICRO)}
    args = SimpleNamespace(surgical_dir=None, surgical_epochs=3, surgical_steps=None, yolo_workers=None, image_cache=None,
                           no_image_cache=False, loader_workers=None)
    grid_cost.check_surgical_options(configs, None, args)  # no exit
    grid_cost.check_surgical_options(configs, ["ultraflwr"], args)
    with pytest.raises(SystemExit):
        grid_cost.check_surgical_options(configs, ["micro"], args)


@pytest.mark.parametrize("option", ["--yolo-workers", "--loader-workers"])
def test_grid_cost_takes_worker_counts_from_zero_in_one_line(option, tmp_path):
    """A negative worker count ended in a traceback inside the timing (--yolo-workers -1: the run's parameter check,
    after the stand-in was read): one line naming the option instead (0 stays: loading in the job's own process)."""
    done = _bench("grid_cost.py", "--config", str(STUDIES / "ultraflwr.yaml"), "--device", "cpu",
                  "--surgical-dir", str(tmp_path), option, "-1", "--results", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"argument {option}: '-1' is not a whole number from 0" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "rows.jsonl").exists()


def test_tracking_cost_names_the_variant_whose_job_failed_in_one_line(tmp_path):
    """A job that fails in its own process (e.g. MLflow not installed) ended the bench in a CalledProcessError
    traceback: one line naming the variant, the job's own output above it."""
    import tracking_cost

    from fedmedbench.fl.spec import RunSpec

    spec = RunSpec(run_dir=str(tmp_path / "run"), study="bench", dataset="bloodmnist", setting="iid", method="fedavg",
                   seed=0, partition_path=str(tmp_path / "missing.json"), sources={"base": str(tmp_path / "none.npz")},
                   image_size=28, train={"rounds": 1}, device="cpu", threads=1)
    with pytest.raises(SystemExit, match=r"^tracking_cost: the tensorboard job failed \(exit 1\); its output is above$"):
        tracking_cost.job_seconds(spec, "tensorboard")


def test_engine_overhead_refuses_waiting_steps_on_the_cpu_in_one_line(tmp_path):
    """On the CPU a step's batch indices are already where its data is, so --waiting-steps timed the same path
    twice and wrote a row as if the steps had waited."""
    done = _bench("engine_overhead.py", "--device", "cpu", "--waiting-steps", "--out", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("engine_overhead: --waiting-steps changes only how steps wait for a GPU: "
                                   "give --device cuda")
    assert not (tmp_path / "rows.jsonl").exists()


def test_batched_rounds_compute_within_the_padding_bound_on_every_quantity_skewed_setting():
    """bench/batch_padding.py on the earlystop grid's own partitions (both datasets at their official sizes, the
    authors' draws, each seed's rounds): one call a step computes 1.5x the useful samples and more under quantity
    skew; the plan the training uses stays within 1.10, a job's round alone and the seeds' rounds together."""
    import torch
    from batch_padding import batch_lengths, load_config, setting_padding

    from fedmedbench.fl.training import batch_indices

    for n, steps in ((600, 13), (256, 5), (3, 4)):  # the lengths batch_indices cuts
        assert batch_lengths(n, 256, steps) == [len(b) for b in batch_indices(n, 256, steps, torch.Generator())]
    config = load_config(STUDIES / "earlystop.yaml")
    for dataset in ("dermamnist", "bloodmnist"):
        for setting in ("qty0.01", "qty0.1", "qty1.0"):
            row = setting_padding(config, "earlystop", dataset, setting, rounds=40)
            for together in ("job", "seeds_together"):
                assert row[f"{together}_one_call_computed_over_useful"] > 1.5, row
                assert row[f"{together}_grouped_computed_over_useful"] <= 1.10, row
                assert row[f"{together}_one_call_calls_per_step"] == 1.0 < row[f"{together}_grouped_calls_per_step"]
    row = setting_padding(config, "earlystop", "dermamnist", "dir0.1", rounds=40)
    assert row["job_grouped_calls_per_step"] == 1.0  # clients of 70 and 77 samples: one call, as before


def _two_dataset_micro(tmp_path: Path) -> Path:
    """The micro study on two datasets (breastmnist and pneumoniamnist), its setting of 3 clients only."""
    import yaml

    config = yaml.safe_load(MICRO.read_text())
    study = config["studies"]["micro"]
    study.update(datasets=["breastmnist", "pneumoniamnist"], settings={"dir": study["settings"]["dir"]},
                 methods=["fedavg", "scaffold"], early_stopping={"report": False})
    (tmp_path / "micro2.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "micro2.yaml"


def test_grid_cost_rows_say_what_they_measured_and_how_the_rest_was_costed(tmp_path):
    """By default every method is timed and every dataset on one setting; a summary row names its date, commit and
    tree state, device, what was timed (datasets, settings, methods, steady rounds) and how the rest was costed, and
    keeps the rates it costed with; with --methods the untimed ones are named with the rate they were costed at."""
    import datetime

    config, results = _two_dataset_micro(tmp_path), tmp_path / "results.jsonl"
    done = _bench("grid_cost.py", "--config", str(config), "--study", "micro", "--device", "cpu", "--rounds", "2",
                  "--threads", "1", "--peak-tflops", "0.001", "--results", str(results), "--note", "a test row")
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads(results.read_text().splitlines()[-1])
    assert row["date"] == datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d") and row["note"] == "a test row"
    assert row["commit"] and row["tree_clean"] in (True, False, None) and row["device"] == "cpu"
    assert row["device_name"].startswith("cpu:") and row["torch"]
    timed = row["timed"]
    assert timed["datasets"] == ["breastmnist", "pneumoniamnist"] and timed["settings"] == ["dir"]
    assert timed["methods"] == ["fedavg", "scaffold"] and row["untimed_methods_at_mean"] == []
    assert timed["pairs"] == {"breastmnist/dir": timed["methods"], "pneumoniamnist/dir": ["fedavg"]}
    assert (timed["rounds"], timed["steady_rounds"]) == (2, 1) and row["timed_on"] == "breastmnist/dir"
    assert set(row["s_per_round"]) == set(timed["methods"]) and "pneumoniamnist/dir" in row["scaled_by"]["s_per_round"]
    assert "every method timed" in row["costing"] and "ratio to breastmnist/dir" in row["costing"]
    assert f"micro: timed {', '.join(timed['methods'])} on breastmnist/dir, pneumoniamnist/dir" in done.stdout
    assert set(row["flops_per_round_by_pair"]) == {"breastmnist/dir", "pneumoniamnist/dir"}
    assert row["floor_flops"] == pytest.approx(row["flops_per_round"] * row["job_rounds"], rel=1e-3)
    done = _bench("grid_cost.py", "--config", str(config), "--study", "micro", "--device", "cpu", "--rounds", "1",
                  "--threads", "1", "--methods", "fedavg", "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads(results.read_text().splitlines()[-1])
    assert row["untimed_methods_at_mean"] == ["scaffold"] and row["timed"]["steady_rounds"] == 1
    assert "scaffold not timed: at the mean of fedavg" in row["costing"]
    assert "scaffold not timed: at the mean of fedavg" in done.stdout
    assert "pneumoniamnist/dir" in row["timed"]["pairs"]
    done = _bench("grid_cost.py", "--config", str(config), "--study", "micro", "--device", "cpu", "--rounds", "1",
                  "--threads", "1", "--methods", "fedavg", "--one-pair", "--dry-run")
    assert done.returncode == 0 and "would time fedavg on breastmnist/dir, 1 rounds each" in done.stdout, done.stdout
    done = _bench("grid_cost.py", "--config", str(config), "--study", "micro", "--device", "cpu", "--rounds", "1",
                  "--threads", "1", "--methods", "fedavg", "--one-pair", "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    one = json.loads(results.read_text().splitlines()[-1])
    assert one["timed"]["pairs"] == {"breastmnist/dir": ["fedavg"]}  # pneumoniamnist not timed, yet in the floor:
    assert set(one["flops_per_round_by_pair"]) == {"breastmnist/dir", "pneumoniamnist/dir"}
    assert one["floor_flops"] == pytest.approx(row["floor_flops"], rel=1e-3)


def test_grid_cost_pairs_time_every_dataset_once():
    """The first method is timed on each --scale-by pair and on every other dataset at the timed setting (where the
    dataset has it), the pair that gives the dataset's ratio: a dataset timed on another setting only would cost its
    jobs of the timed setting at the timed dataset's rate."""
    from grid_cost import dataset_pairs

    jobs = [{"dataset": d, "setting": s} for d in ("derma", "blood", "path") for s in ("dir", "qty")]
    jobs.append({"dataset": "only", "setting": "own"})
    first = {"dataset": "derma", "setting": "qty"}
    assert dataset_pairs(jobs, first, None) == ["blood/qty", "path/qty", "only/own"]
    assert dataset_pairs(jobs, first, ["blood/dir", "derma/dir"]) == ["blood/dir", "derma/dir", "blood/qty", "path/qty",
                                                                      "only/own"]
    assert dataset_pairs(jobs, first, ["path/qty"]) == ["path/qty", "blood/qty", "only/own"]


def test_the_earlystop_floor_counts_both_datasets():
    """2 x 300 jobs x 500 rounds: DermaMNIST's rounds (10 clients x 70.07 samples x 5 epochs trained, 3,008
    evaluated) and BloodMNIST's (119.59 samples a client, 5,133 evaluated) at ConvNeXtV2-nano's 399.2 MFLOP a forward
    pass: 2.19e18 FLOP, 5.07 GPU-hours at 30 % of the bench's 400 TFLOP/s (3.75 when every job was DermaMNIST's)."""
    import grid_cost
    from _flop_floor import floor_fields, round_flops

    from fedmedbench.data.medmnist import dataset_info

    config = grid_cost.load_config(STUDIES / "earlystop.yaml")
    jobs = grid_cost.grid_jobs(config, "earlystop")
    assert len(jobs) == 600 and {j["dataset"] for j in jobs} == {"dermamnist", "bloodmnist"}
    work = {}
    for dataset in ("dermamnist", "bloodmnist"):
        n = dataset_info(dataset).n_samples
        work[dataset, "dir0.01"] = {"flops_per_round": round_flops(399174400, 10 * n["train"] / 100 * 5,
                                                                   n["val"] + n["test"])}
    floor = grid_cost.grid_floor_flops(jobs, work, ("dermamnist", "dir0.01"))
    assert floor["floor_flops"] == pytest.approx(2.19e18, rel=2e-3)
    hours = floor_fields(floor["flops_per_round"], 400e12, None, sum(j["rounds"] for j in jobs))["floor_gpu_hours_30"]
    assert hours == pytest.approx(5.07, abs=0.005)
    derma_only = grid_cost.grid_floor_flops(jobs, {k: v for k, v in work.items() if k[0] == "dermamnist"},
                                            ("dermamnist", "dir0.01"))
    assert floor_fields(derma_only["flops_per_round"], 400e12, None, 300_000)["floor_gpu_hours_30"] == pytest.approx(
        3.75, abs=0.005)


def test_a_tree_copied_without_git_takes_its_commit_from_the_sender(monkeypatch, tmp_path):
    """A copy without .git (a GPU machine lent a copy, rsync to a cluster): FMB_TREE gives the commit, and "clean" the
    sender's check; the row says the sender gave it. Where git reads the tree, its word wins."""
    import grid_cost
    from _report import given_tree, tree_state

    monkeypatch.delenv("FMB_TREE", raising=False)
    assert tree_state(tmp_path)["commit"] == "?" and tree_state(tmp_path)["tree_clean"] is None
    monkeypatch.setenv("FMB_TREE", "abc1234")
    assert tree_state(tmp_path) == {"commit": "abc1234", "tree_clean": None, "changed": [], "tree_given": True}
    monkeypatch.setenv("FMB_TREE", "abc1234:clean")
    given = tree_state(tmp_path)
    assert given["tree_clean"] is True and given["commit"] == "abc1234"
    grid_cost.check_tree(given, grid_cost.RESULTS, allow_dirty=False)  # the project's record takes it
    assert grid_cost.provenance(given, allow_dirty=False)["tree_given"] is True
    assert tree_state(grid_cost.ROOT)["commit"] != "abc1234"  # this checkout: git says
    for bad in ("abc1234:dirty", "HEAD"):
        monkeypatch.setenv("FMB_TREE", bad)
        with pytest.raises(SystemExit, match=f"FMB_TREE={bad}: give COMMIT or COMMIT:clean"):
            given_tree()
        with pytest.raises(SystemExit, match=f"FMB_TREE={bad}: give COMMIT or COMMIT:clean"):
            tree_state(tmp_path)  # grid_cost and gpu_packing read it before they time anything
        assert given_tree(strict=False)["commit"] == "?"  # git_head, once a bench has measured: its row is kept


def test_gpu_session_refuses_a_malformed_fmb_tree_before_any_step(tmp_path):
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/bash\necho \"$*\" >> {calls}\n")
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake), steps="CUDA tests", FMB_TREE="HEAD:clean")
    assert done.returncode == 2 and "FMB_TREE=HEAD:clean: give COMMIT or COMMIT:clean" in done.stderr
    assert not calls.exists()


def test_a_row_names_its_commit_and_whether_its_tree_was_clean(tmp_path):
    """A tree whose tracked code differs from its commit is not clean (result records, *.jsonl, do not count); the
    project's own record takes rows of a clean tree only, or with --allow-dirty; another file takes them marked."""
    import grid_cost
    from _report import tree_state

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "rows.jsonl").write_text("{}\n")
    git("add", ".")
    git("commit", "-qm", "one")
    state = tree_state(tmp_path)
    assert state["tree_clean"] is True and len(state["commit"]) >= 7 and state["changed"] == []
    (tmp_path / "rows.jsonl").write_text("{}\n{}\n")  # a session's appended rows
    (tmp_path / "new.py").write_text("")  # untracked
    assert tree_state(tmp_path)["tree_clean"] is True
    (tmp_path / "code.py").write_text("x = 2\n")
    dirty = tree_state(tmp_path)
    assert dirty["tree_clean"] is False and dirty["changed"] == ["code.py"]
    assert tree_state(tmp_path / "nowhere")["tree_clean"] is None  # no git there
    with pytest.raises(SystemExit, match=r"grid_cost_results.jsonl takes rows of committed code only \(changed files: "
                                         r"code.py\); commit them, give another --results, or --allow-dirty"):
        grid_cost.check_tree(dirty, grid_cost.RESULTS, allow_dirty=False)
    with pytest.raises(SystemExit, match="git cannot say"):
        grid_cost.check_tree({"commit": "?", "tree_clean": None, "changed": []}, grid_cost.RESULTS, allow_dirty=False)
    grid_cost.check_tree(dirty, grid_cost.RESULTS, allow_dirty=True)
    grid_cost.check_tree(dirty, tmp_path / "other.jsonl", allow_dirty=False)
    grid_cost.check_tree(state, grid_cost.RESULTS, allow_dirty=False)
    fields = grid_cost.provenance(dirty, True, "cut to one round")
    assert fields["tree_clean"] is False and fields["changed"] == ["code.py"] and fields["allow_dirty"] is True
    assert fields["note"] == "cut to one round" and "changed" not in grid_cost.provenance(state, False)


def test_a_fedst_timing_of_fewer_local_steps_is_scaled_back_to_the_configs():
    """--surgical-steps 20 of the config's 100: 20 local steps a timed round, FedST's 100 server steps cut to 20, and
    a round's training scaled by 5; more steps than the config's, or none, is one line."""
    import grid_cost
    from _surgical_cost import fedst_timed_config, steps_share

    cfg = grid_cost.load_config(STUDIES / "fedst.yaml")["fedst"]
    assert cfg["train"]["local_steps"] == 100 and cfg["serq"]["steps"] == 100
    timed = fedst_timed_config(cfg, 3, 0.1, 20)
    assert timed["train"]["local_steps"] == 20 and timed["serq"]["steps"] == 20 and timed["train"]["rounds"] == 3
    assert steps_share(cfg, 20) == 0.2 and steps_share(cfg, None) == 1.0
    assert fedst_timed_config(cfg, 3, 0.1)["train"]["local_steps"] == 100
    with pytest.raises(SystemExit, match="--surgical-steps 101: give 1 to the config's 100 local steps a round"):
        steps_share(cfg, 101)


def test_the_grid_session_runs_its_steps_in_budget_order_and_each_passes_its_scripts_checks(tmp_path):
    """STEPS='^grid:' runs the paper grids' steps only (none of the whole session's), their stand-ins built first and
    waited for; every timing writes its summary to the grid results; each step's command passes its script's own
    checks of its options against the configs (--dry-run: nothing timed). A whole session runs none of them."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/bash\n[ \"$1\" = -c ] && exit 0\necho \"$*\" >> {calls}\n")
    fake.chmod(0o755)
    done = _run_session(tmp_path, str(fake), steps="^grid:", GRID_RESULTS=str(tmp_path / "grid.jsonl"))
    assert done.returncode == 0, done.stdout + done.stderr
    ran = calls.read_text().splitlines()
    builds = [c for c in ran if "surgical_stand_in.py" in c]
    steps = [c for c in ran if c not in builds]
    assert [f"--out {tmp_path / 'si'}/grid-{s}" in " ".join(builds) for s in ("fedst", "ultraflwr")] == [True, True]
    assert "--fraction 0.1 --test-fraction 0.05" in next(c for c in builds if "fedst.yaml" in c)
    timings = [c for c in steps if "grid_cost.py" in c]
    assert len(steps) == 10 and len(timings) == 8 and all(f"--results {tmp_path / 'grid.jsonl'}" in c for c in timings)
    assert [c.split("--config config/studies/")[1].split(".yaml")[0] for c in timings] == [
        "earlystop", "earlystop", "earlystop", "earlystop", "fedst", "ultraflwr", "gpaf", "gpaf"]
    earlystop = timings[:4]
    assert "--methods" not in earlystop[0] and "--batch-clients" in earlystop[0]  # all ten, clients together
    assert "--no-batch-clients" in earlystop[1] and "--batch-padding inf" in earlystop[2]
    assert "--runs-together 3" in earlystop[3]
    assert "--methods fedst seg_fedavg" in timings[4] and "--surgical-steps 20" in timings[4]
    summary = done.stdout.split("== summary")[1]
    assert "grid: fedst data" in summary and "grid: ultraflwr data" in summary and "cuda tests" not in summary
    root = GPU_SESSION.parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    for c in steps:
        script, *args = c.split()
        checked = _run_script(root / script, *args, "--dry-run", env=env, cwd=root)
        assert checked.returncode == 0 and "would" in checked.stdout, (c, checked.stdout + checked.stderr)
    calls.unlink()
    done = _run_session(tmp_path, str(fake), steps="ultraflwr")  # a pattern without "grid:": the session's own steps
    assert done.returncode == 0 and "grid:" not in done.stdout and "grid-ultraflwr" not in calls.read_text()


def test_grid_cost_batch_padding_sets_the_plans_bound_for_the_timing_and_names_the_lever(tmp_path, monkeypatch):
    """--batch-padding inf times the clients together as one call a step (every client padded to the largest
    batch, the plan before the grouped calls): the timed plans see the bound and the row names it."""
    from types import SimpleNamespace as NS

    import grid_cost

    from fedmedbench.fl.methods import _batch_plan

    seen = []
    monkeypatch.setattr(_batch_plan, "PADDING", _batch_plan.PADDING)  # put back after the test
    monkeypatch.setattr(grid_cost, "study_cost", lambda *a, **k: seen.append(_batch_plan.PADDING) or {"s_per_round": {}})
    args = NS(config=[MICRO], study=["micro"], methods=None, setting=None, scale_by=None, autocast=None,
              torch_profile=None, batch_clients=True, runs_together=1, batch_padding=float("inf"), surgical_dir=None,
              surgical_epochs=None, surgical_steps=None, yolo_workers=None, image_cache=None, no_image_cache=False,
              loader_workers=None, rounds=1, threads=1, packing=1.0, waiting_steps=False, one_pair=False)
    row = next(grid_cost.cost_rows(args, "cpu"))
    assert seen == [float("inf")] and row["batch_padding"] == float("inf") and row["batch_clients"] is True
    assert "batch_padding=inf" in grid_cost.levers(row, args)


def test_a_surgical_study_plans_what_it_times():
    """The dry run names the method a surgical study times, not its config's first: FedST (with its evaluating
    round) for fedst, FedAvg for ultraflwr, each unless --methods names others of its own."""
    from _surgical_cost import timed_names

    names = ["seg_local", "seg_fedavg", "fedst"]
    assert timed_names("fedst", names, None) == ["fedst"]
    assert timed_names("fedst", names, ["seg_fedavg", "fedavg"]) == ["seg_fedavg"]
    assert timed_names("fedst", names, ["fedavg"]) == ["seg_local"]
    assert timed_names("ultraflwr", ["FedMedian", "FedAvg"], None) == ["FedAvg"]
    root = BENCH.parent
    done = _bench("grid_cost.py", "--config", str(root / "config/studies/fedst.yaml"), "--rounds", "2",
                  "--device", "cpu", "--dry-run")
    assert done.returncode == 0 and done.stdout.startswith("fedst: would time fedst, 2 rounds each;"), done.stdout
    assert "seg_local, seg_centralized, seg_fedavg" in done.stdout
