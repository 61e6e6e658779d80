"""What a user sees when something is wrong: one line per error naming the config file and key, no traceback
(unless FEDMEDBENCH_DEBUG=1), and a rerun's reason as the changed keys, old -> new."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import copy_workflow

from fedmedbench.config.check import ConfigError
from fedmedbench.workflow import diagnostics
from fedmedbench.workflow.rerun_reason import params_diff

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema.yaml"
MICRO = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())


def _snakemake(cwd: Path, *args: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != diagnostics.DEBUG_ENV}
    if debug:
        env[diagnostics.DEBUG_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize("name", ["config.yaml", *(f"studies/{p.name}" for p in sorted((ROOT / "config" / "studies").glob("*.yaml")))])
def test_the_defaults_filled_in_are_snakemakes(name):
    """validate_config fills each missing key with its schema default exactly as snakemake.utils.validate does
    (the same mapping, key order included)."""
    from snakemake.utils import validate

    from fedmedbench.config.check import coerce_numbers

    raw = yaml.safe_load((ROOT / "config" / name).read_text())
    coerce_numbers(raw, SCHEMA)
    ours, theirs = copy.deepcopy(raw), copy.deepcopy(raw)
    diagnostics.validate_config(ours, SCHEMA)
    validate(theirs, str(SCHEMA))
    assert json.dumps(ours) == json.dumps(theirs)
    assert json.dumps(ours) != json.dumps(raw)  # some default was filled in


def test_a_default_enters_the_config_as_a_copy():
    """Two configs checked in one process never share a default's object, nor change the schema's default."""
    from fedmedbench.config.check import load_schema

    first, second = copy.deepcopy(MICRO), copy.deepcopy(MICRO)
    first.pop("tracking", None)
    second.pop("tracking", None)
    diagnostics.validate_config(first, SCHEMA)
    diagnostics.validate_config(second, SCHEMA)
    assert first["tracking"] == second["tracking"] == {"tensorboard": False, "mlflow": False, "wandb": False,
                                                       "client_metrics": True}
    assert first["tracking"] is not second["tracking"]
    assert load_schema(SCHEMA)["properties"]["tracking"]["default"] == {}


def test_unknown_top_level_key_is_one_line_with_the_allowed_keys():
    cfg = copy.deepcopy(MICRO)
    cfg["foo"] = 1
    with pytest.raises(ConfigError) as info:
        diagnostics.validate_config(cfg, SCHEMA)
    err = info.value
    assert err.key == "foo"
    allowed = sorted(yaml.safe_load(SCHEMA.read_text())["properties"])
    assert err.detail == f"unknown key 'foo'; allowed: {', '.join(allowed)}"


def test_unknown_nested_key_names_its_parent_and_a_bad_value_its_path():
    cfg = copy.deepcopy(MICRO)
    cfg["studies"]["micro"]["train"]["lrr"] = 0.1
    with pytest.raises(ConfigError) as info:
        diagnostics.validate_config(cfg, SCHEMA)
    assert info.value.key == "studies.micro.train.lrr"
    assert "under 'studies.micro.train'" in info.value.detail and "lr, lr_decay" in info.value.detail
    cfg = copy.deepcopy(MICRO)
    cfg["studies"]["micro"]["methods"] = ["fedavg", "fedfoo"]
    with pytest.raises(ConfigError) as info:
        diagnostics.validate_config(cfg, SCHEMA)
    assert info.value.key == "studies.micro.methods.1" and info.value.detail.startswith("'fedfoo' is not one of")


def test_the_file_that_sets_a_key_is_named(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("studies:\n  s:\n    settings:\n      dir0.5: {num_clients: 3}\n")
    b.write_text("device: cpu\nstudies:\n  s:\n    seeds: [0]\n")
    assert diagnostics.key_file("studies.s.settings.dir0.5.num_clients", [a, b]) == str(a)  # a name with a dot
    assert diagnostics.key_file("studies.s.seeds", [a, b]) == str(b)
    assert diagnostics.key_file("studies.s", [a, b]) == str(b)  # both set it: the later file wins
    assert diagnostics.key_file("surgical.root", [a, b]) is None
    line = diagnostics.config_error_line(ConfigError("surgical.root", "needed"), [a])
    assert line == f"config error at 'surgical.root' (not set in {a}: a default or --config): needed"


def test_workflow_prints_a_config_error_once_without_traceback(tmp_path):
    cfg = copy.deepcopy(MICRO)
    cfg["foo"] = 1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = _snakemake(ROOT, "-n", "--quiet", "--configfile", str(tmp_path / "bad.yaml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [line for line in out.splitlines() if "foo" in line]
    assert lines == [f"config error in {tmp_path / 'bad.yaml'} at 'foo': unknown key 'foo'; allowed: "
                     + ", ".join(sorted(yaml.safe_load(SCHEMA.read_text())["properties"]))]
    assert "Traceback" not in out and "Failed validating" not in out and "On instance" not in out
    assert len(out.splitlines()) < 5, out
    # a cross-field error: the same, naming the file and the key
    cfg = copy.deepcopy(MICRO)
    cfg["studies"]["micro"]["clients_per_round"] = 9
    (tmp_path / "cross.yaml").write_text(yaml.safe_dump(cfg))
    proc = _snakemake(ROOT, "-n", "--quiet", "--configfile", str(tmp_path / "cross.yaml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count("config error") == 1 and 'File "' not in out, out
    assert f"config error in {tmp_path / 'cross.yaml'} at 'studies.micro.clients_per_round': 9 exceeds" in out
    # asked for: the traceback
    proc = _snakemake(ROOT, "-n", "--quiet", "--configfile", str(tmp_path / "cross.yaml"), debug=True)
    assert proc.returncode != 0 and 'File "' in proc.stdout + proc.stderr


# ---------------------------------------------------------------- a job's error


def _bad_digits_workflow(tmp_path: Path) -> Path:
    work = copy_workflow(tmp_path / "wf")
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 40), ("val", 10), ("test", 10)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 3, (n, 1)).astype(np.uint8)
    arrays["val_labels"][0] = 7  # a label past the three classes
    np.savez(work / "bad.npz", **arrays)
    cfg = {"data": {"origin": "real"}, "device": "cpu",
           "datasets": {"mine": {"path": "bad.npz", "labels": ["a", "b", "c"], "task": "multi-class", "channels": 1}},
           "studies": {"s": {"datasets": ["mine"], "seeds": [0], "methods": ["fedavg"],
                             "settings": {"iid": {"scheme": "iid", "num_clients": 2}}}}}
    (work / "mine.yaml").write_text(yaml.safe_dump(cfg))
    return work


def test_a_data_error_is_printed_once_naming_file_and_key(tmp_path):
    work = _bad_digits_workflow(tmp_path)
    proc = _snakemake(work, "--cores", "1", "resources/user/mine_28.npz", "--configfile", "mine.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    needle = "bad.npz: val_labels go up to 7 but the dataset has 3 classes"
    assert out.count(needle) == 1, out
    line = next(line for line in out.splitlines() if needle in line)
    assert line.startswith("error: bad.npz: val_labels") and "[config key 'datasets.mine' in mine.yaml]" in line
    assert "logs/import_user_dataset/mine_28.log" in line
    assert "Traceback" not in out
    log = (work / "logs" / "import_user_dataset" / "mine_28.log").read_text()
    assert "Traceback" in log and needle in log  # the full record stays in the log
    proc = _snakemake(work, "--cores", "1", "resources/user/mine_28.npz", "--configfile", "mine.yaml", debug=True)
    assert "Traceback" in proc.stdout + proc.stderr


def test_job_error_line_names_the_type_where_the_message_alone_says_little():
    assert diagnostics.job_error_line(KeyError("lr"), "x.log").startswith("error: KeyError: 'lr' (traceback in x.log")
    assert diagnostics.job_error_line(ValueError("a\nb\nc"), "x.log").startswith("error: a (+2 lines in the log)")


# ---------------------------------------------------------------- why a job reruns


def test_params_diff_names_the_changed_keys_old_to_new():
    old = repr({"train": {"lr": 0.05, "rounds": 10}, "method": "fedavg", "seed": 0})
    new = repr({"train": {"lr": 0.1, "rounds": 10}, "method": "fedavg", "seed": 0, "mu": 0.01})
    assert params_diff({old, "['global_accuracy']"}, {new, "['global_accuracy']"}) == "mu (unset) -> 0.01; train.lr 0.05 -> 0.1"
    assert params_diff({old}, {new}) == "mu (unset) -> 0.01; train.lr 0.05 -> 0.1"
    # two changed params of one rule are paired by their keys, not by their order
    a_old, a_new = repr({"alpha": 1, "beta": 2}), repr({"alpha": 1, "beta": 3})
    z_old, z_new = repr({"zeta": 5}), repr({"zeta": 6})
    assert params_diff({a_old, z_old}, {z_new, a_new}) == "beta 2 -> 3; zeta 5 -> 6"
    assert params_diff({"'x'"}, {"'y'"}) == "value 'x' -> 'y'"


def test_a_rerun_names_the_changed_params(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    cfg = copy.deepcopy(MICRO)
    (work / "a.yaml").write_text(yaml.safe_dump(cfg))
    cfg["data"]["synthetic"]["difficulty"] = 0.6
    (work / "b.yaml").write_text(yaml.safe_dump(cfg))
    target = "resources/synthetic/breastmnist_28.npz"
    proc = _snakemake(work, "--cores", "1", target, "--configfile", "a.yaml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _snakemake(work, "-n", target, "--configfile", "b.yaml")
    out = proc.stdout + proc.stderr
    assert "reason: Params have changed since last execution: difficulty 0.4 -> 0.6" in out, out
    assert "before:" not in out
