"""Config validation: defaults filled, bad values fail naming the key (schema + cross-field checks)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = str(ROOT / "config" / "schema.yaml")
MICRO = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())


def test_demo_and_micro_configs_validate_with_defaults():
    for cfg in (yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), copy.deepcopy(MICRO)):
        validate(cfg, SCHEMA)
        study = next(iter(cfg["studies"].values()))
        assert study["train"]["eval_batch_size"] == 256 and study["model"]["name"] == "cnn_small"
        assert cfg["data"]["download"]["retries"] == 3


def _bad(path: list, value):
    cfg = copy.deepcopy(MICRO)
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return cfg


@pytest.mark.parametrize("path,value,needle", [
    (["studies", "micro", "methods"], ["fedfoo"], "'fedfoo' is not one of"),
    (["studies", "micro", "datasets"], ["Chest MNIST"], "'Chest MNIST' is not valid under any of the given schemas"),
    (["studies", "micro", "settings", "dir", "scheme"], "nope", "'nope' is not one of"),
    (["studies", "micro", "settings", "dir", "num_clients"], 0, "num_clients"),
    (["studies", "micro", "settings", "dir", "params"], {"alpha": -1}, "alpha"),
    (["studies", "micro", "settings", "dir", "params"], {"classes_per_client": 2}, "classes_per_client"),
    (["studies", "micro", "train", "lr"], "fast", "'fast' is not of type 'number'"),
    (["studies", "micro", "train", "rounds"], 0, "rounds"),
    (["studies", "micro", "train", "bogus"], 1, "bogus"),
    (["device"], "tpu", "'tpu' is not one of"),
    (["studies", "micro", "method_params"], {"fedavg": {"mu": 0.1}}, "'mu' was unexpected"),
    (["studies", "micro", "method_params"], {"fedprox": {"mu": -1}}, "mu"),
    (["data", "origin"], "imaginary", "origin"),
    (["studies", "micro", "early_stopping", "counting"], "sideways", "'sideways' is not one of"),
    (["studies", "micro", "early_stopping", "never_fired"], "ignore", "'ignore' is not one of"),
    (["studies", "micro", "train", "input_norm"], "triple", "'triple' is not one of"),
    (["studies", "micro", "method_params"], {"scaffold": {"local_iterations": "textbook"}}, "local_iterations"),
    (["domains", "base"], [], "'base' does not match"),  # reserved: the unshifted data source of a run
    (["surgical"], {"synthetic": {"datasets": {"m2cai16": {"style": "cholecystectomy_a", "distinct_frames": 0}}}},
     "distinct_frames"),
    (["surgical"], {"synthetic": {"datasets": {"m2cai16": {"style": "cholecystectomy_a", "width": 8192}}}}, "width"),
])
def test_schema_errors_name_the_key(path, value, needle):
    with pytest.raises(Exception) as info:
        validate(_bad(path, value), SCHEMA)
    text = str(info.value)
    assert needle in text
    assert path[-1] in text or path[-2] in text  # the failing key or its parent is named


def _dry_run(tmp_path, cfg) -> subprocess.CompletedProcess:
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "--configfile", str(f)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c["studies"]["micro"]["settings"]["dom"]["params"].__setitem__("domains", ["clean", "martian"]),
     "studies.micro.settings.dom.params.domains"),
    (lambda c: c["studies"]["micro"]["settings"]["dom"].__setitem__("num_clients", 3), "studies.micro.settings.dom.num_clients"),
    (lambda c: c["studies"]["micro"]["settings"]["dir"].__setitem__("method_train", {"fedprox": {"lr": 0.1}}),
     "studies.micro.settings.dir.method_train.fedprox"),
    (lambda c: c["studies"]["micro"].__setitem__("clients_per_round", 9), "studies.micro.clients_per_round"),
    (lambda c: c["studies"]["micro"]["settings"]["dir"].__setitem__("datasets", ["pathmnist"]), "studies.micro.settings.dir.datasets"),
    (lambda c: c["studies"]["micro"].__setitem__("datasets", ["chestmnist"]), "'chestmnist' is neither an official MedMNIST flag"),
    (lambda c: c["studies"]["micro"].__setitem__("random_draws", "reference"), "studies.micro.settings.dir.scheme"),
    (lambda c: c.__setitem__("datasets", {"mine": {"path": "x.npz", "labels": ["a", "b", "c"], "task": "binary", "channels": 1}}),
     "datasets.mine.labels"),
])
def test_cross_field_errors_name_the_key(tmp_path, mutate, needle):
    cfg = copy.deepcopy(MICRO)
    mutate(cfg)
    proc = _dry_run(tmp_path, cfg)
    assert proc.returncode != 0
    assert needle in proc.stdout + proc.stderr


def test_micro_config_plans(tmp_path):
    proc = _dry_run(tmp_path, copy.deepcopy(MICRO))
    assert proc.returncode == 0, proc.stderr


def test_more_clients_than_validation_samples_warns_at_planning(tmp_path):
    cfg = copy.deepcopy(MICRO)  # synthetic: 30 validation and 60 test samples
    cfg["studies"]["micro"]["settings"]["dir"]["num_clients"] = 40
    proc = _dry_run(tmp_path, cfg)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("config warning: studies.micro.settings.dir.num_clients = 40 but breastmnist has val (30 samples)"
            in proc.stderr)
    assert "settings.dom" not in proc.stderr  # 2 clients: each gets some
