"""One source for method names and hyper-parameters: each method's ``params`` declaration.

The schema's method-name enums and ``method_params`` blocks must equal what the registry and the
declarations give; the workflow's torch-free reading of the declarations must equal the classes';
a parameter typo or out-of-bounds value fails at planning naming its key; a user's method file
registers like a built-in one (README "Your own method") and its content is in its runs' hash.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml

from fedmedbench.fl.api import method_params as MP
from fedmedbench.fl.api.method_source import builtin_sources
from fedmedbench.fl.api.params import Param
from fedmedbench.fl.api.registry import (
    METHODS,
    DuplicateMethodError,
    available_methods,
    get_method,
    load_method_file,
)
from fedmedbench.fl.spec import RunSpec

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
FEDNOVA = ROOT / "examples" / "methods" / "fednova.py"
FEDPROX_HOOK = ROOT / "examples" / "methods" / "fedprox_hook.py"


pytestmark = pytest.mark.usefixtures("restore_registry")


def by_task(task: str) -> list[str]:
    return [n for n in available_methods() if METHODS[n].task == task]


def test_the_workflows_reading_of_the_declarations_is_the_classes():
    static = builtin_sources()
    assert sorted(static) == available_methods()
    for name in available_methods():
        assert static[name].params() == METHODS[name].declared_params(), name


def test_every_parameter_is_described_and_its_default_is_valid():
    for name in available_methods():
        for p in METHODS[name].declared_params().values():
            assert p.doc, f"{name}.{p.name} has no description"
            assert p.problem(p.default) is None, f"{name}.{p.name}: default {p.default!r} {p.problem(p.default)}"


def test_param_bounds_choices_and_types():
    p = Param("alpha", float, 0.1, "x", low=0, high=1, low_open=True)
    assert p.problem(0.5) is None and p.problem(1) is None
    assert p.problem(0.0) == "must be > 0, got 0.0" and p.problem(1.5) == "must be <= 1, got 1.5"
    assert p.problem(True).startswith("must be of type number") and p.problem(None) == "must not be null"
    c = Param("form", str, "a", "x", choices=("a", "b"))
    assert c.problem("c") == "'c': choose one of ['a', 'b']"
    assert Param("label_alpha", float, 1.0, "x", low=0, low_open=True, also=("partition",)).problem("partition") is None


def test_schema_method_names_are_the_registrys():
    defs = SCHEMA["definitions"]
    assert set(defs["method_name"]["enum"]) == set(by_task("classification"))
    fedst = SCHEMA["properties"]["fedst"]["properties"]
    assert set(fedst["methods"]["items"]["enum"]) == set(by_task("segmentation"))
    assert set(fedst["fig7"]["properties"]["methods"]["items"]["enum"]) == set(by_task("segmentation"))


def test_schema_method_params_blocks_are_the_declarations():
    known = builtin_sources()
    study = SCHEMA["definitions"]["study"]["properties"]["method_params"]["properties"]
    assert study == MP.method_params_schema(by_task("classification"), known)
    fedst = SCHEMA["properties"]["fedst"]["properties"]["method_params"]["properties"]
    assert fedst == MP.method_params_schema(by_task("segmentation"), known)


def planning_error(config: dict) -> str:
    with pytest.raises(ValueError) as err:
        MP.check(config, MP.sources(config))
    return str(err.value)


def test_a_parameter_typo_or_bad_value_fails_at_planning_naming_its_key():
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    MP.check(demo, MP.sources(demo))  # the demo passes
    cfg = {"studies": {"gpaf": {"methods": ["gpaf"], "method_params": {"gpaf": {"lamda_adv": 0.3}}}}}
    msg = planning_error(cfg)
    assert msg.startswith("config error at 'studies.gpaf.method_params.gpaf.lamda_adv': unknown parameter of method gpaf; "
                          "known: adv_start_round, "), msg
    cfg = {"studies": {"s": {"settings": {"d": {"method_params": {"moon": {"temperature": 0}}}}}}}
    assert planning_error(cfg) == "config error at 'studies.s.settings.d.method_params.moon.temperature': must be > 0, got 0"
    assert "'fedst.method_params.fedas.align_mode'" in planning_error({"fedst": {"method_params": {"fedas": {"align_mode": "x"}}}})
    msg = planning_error({"studies": {"s": {"methods": ["fedavg", "fedfoo"]}}})
    assert msg.startswith("config error at 'studies.s.methods': unknown method 'fedfoo'; registered: centralized, "), msg


def user_file(folder: Path, name: str, body: str = "") -> Path:
    path = folder / f"{name}.py"
    path.write_text("from fedmedbench.fl.api import Method, Param\nfrom fedmedbench.fl.api.registry import register_method\n\n\n"
                    f"@register_method({name!r})\nclass Mine(Method):\n    params = (Param('k', int, 2, 'a k', low=1),)\n{body}")
    return path


def test_a_user_method_named_like_a_built_in_is_an_error_naming_both(tmp_path):
    path = user_file(tmp_path, "fedavg")
    msg = planning_error({"methods": {"fedavg": str(path)}})
    assert "methods.fedavg" in msg and str(path) in msg and "fl/methods/fedavg.py" in msg and "FedAvg" in msg
    with pytest.raises(DuplicateMethodError, match=r"fedavg.*already registered by fedmedbench\.fl\.methods\.fedavg\.FedAvg"):
        load_method_file("fedavg", path)


def test_a_user_file_must_exist_and_register_its_name(tmp_path):
    path = user_file(tmp_path, "mine")
    assert "is not a file" in planning_error({"methods": {"other": str(tmp_path / "nope.py")}})
    assert "registers no method 'other'" in planning_error({"methods": {"other": str(path)}})


def test_a_user_file_that_does_not_parse_or_declares_a_bad_param_fails_naming_its_key(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("class Mine(:\n")
    msg = planning_error({"methods": {"broken": str(broken)}})
    assert msg.startswith("config error at 'methods.broken': ") and str(broken) in msg
    path = user_file(tmp_path, "mine_b", "    other = 1\n")
    path.write_text(path.read_text().replace("Param('k', int, 2, 'a k', low=1)", "Param('k', int, 2, bogus=1)"))
    msg = planning_error({"methods": {"mine_b": str(path)}})
    assert msg.startswith("config error at 'methods.mine_b': ") and "bogus" in msg


def test_a_user_methods_parameters_come_from_its_file(tmp_path):
    path = user_file(tmp_path, "mine_k")
    cfg = {"methods": {"mine_k": str(path)}, "studies": {"s": {"methods": ["mine_k"], "method_params": {"mine_k": {"k": 0}}}}}
    assert planning_error(cfg) == "config error at 'studies.s.method_params.mine_k.k': must be >= 1, got 0"
    cfg["studies"]["s"]["method_params"]["mine_k"] = {"k": 3}
    MP.check(cfg, MP.sources(cfg))
    assert get_method("mine_k", {"k": 3}, str(path)).p == {"k": 3}
    schema = yaml.safe_load(Path(MP.schema_for(cfg, ROOT / "config" / "schema.yaml", MP.sources(cfg), tmp_path)).read_text())
    assert "mine_k" in schema["definitions"]["method_name"]["enum"]
    assert schema["definitions"]["study"]["properties"]["method_params"]["properties"]["mine_k"]["properties"]["k"]["minimum"] == 1


def test_an_installed_package_registers_methods_through_its_entry_point(tmp_path, monkeypatch):
    """A real distribution on sys.path (its dist-info with entry_points.txt), found by importlib.metadata."""
    from fedmedbench.fl.api.method_source import entry_point_sources

    user_file(tmp_path, "ep_method")
    dist = tmp_path / "ep_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fedmedbench.methods]\nep_method = ep_method\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert entry_point_sources()["ep_method"].params()["k"].default == 2
    assert "ep_method" in MP.sources({})
    assert get_method("ep_method", {"k": 5}).p == {"k": 5}


def test_built_in_run_hashes_are_unchanged_and_a_user_files_content_is_hashed(tmp_path):
    spec = dict(run_dir="r", study="s", dataset="breastmnist", setting="dir", method="fedprox", seed=0,
                partition_path="p.json", sources={"x": "y"}, image_size=28, train={"rounds": 2, "lr": 0.05},
                method_params={"mu": 0.01})
    assert RunSpec(**spec).run_hash() == "25bc78f404cfa806"  # the hash before user methods existed
    path = user_file(tmp_path, "mine_h")
    cfg = {"methods": {"mine_h": str(path)}}
    assert MP.run_fields("fedprox", MP.sources(cfg), cfg) == {}
    before = MP.run_fields("mine_h", MP.sources(cfg), cfg)
    path.write_text(path.read_text() + "# edited\n")
    after = MP.run_fields("mine_h", MP.sources(cfg), cfg)
    assert before["method_file"] == after["method_file"] == str(path.resolve())
    hashes = {RunSpec(**{**spec, "method": "mine_h", **fields}).run_hash() for fields in (before, after)}
    assert len(hashes) == 2


def test_a_job_refuses_a_method_file_edited_after_planning(tmp_path):
    from fedmedbench.fl.engine.job import check_method_file

    path = user_file(tmp_path, "mine_j")
    cfg = {"methods": {"mine_j": str(path)}}
    spec = RunSpec(run_dir="r", study="s", dataset="d", setting="x", method="mine_j", seed=0, partition_path="p",
                   sources={}, image_size=28, **MP.run_fields("mine_j", MP.sources(cfg), cfg))
    check_method_file(spec)  # as planned
    path.write_text(path.read_text() + "# edited\n")
    with pytest.raises(RuntimeError, match=r"mine_j\.py changed after this run was planned"):
        check_method_file(spec)


def test_fednova_normalises_each_clients_update_by_its_steps():
    from fedmedbench.fl.api import ClientResult

    method = get_method("fednova", {}, str(FEDNOVA))
    # n = (1, 3), tau = (1, 3): p = (1/4, 3/4), tau_eff = 5/2, each update weighted 5/2 * p_i / tau_i = 5/8
    g = {"w": torch.zeros(2), "count": torch.tensor(4)}
    results = [ClientResult({"w": torch.full((2,), v), "count": torch.tensor(5)}, n, {"local_steps": t})
               for v, n, t in ((1.0, 1, 1.0), (2.0, 3, 3.0))]
    out = method.aggregate(SimpleNamespace(global_arrays=g, results=results))
    torch.testing.assert_close(out["w"], torch.full((2,), 5 / 8 * 1.0 + 5 / 8 * 2.0))  # FedAvg: 1/4 + 3/2 = 1.75
    assert out["w"].dtype == torch.float32 and int(out["count"]) == 5


def test_fedprox_through_the_loss_hook_trains_as_the_built_in_fedprox(tmp_path):
    """examples/methods/fedprox_hook.py (``Method.extra_loss`` only; it imports only ``fedmedbench.fl.api``), trained
    by the engine for 2 rounds, ends as the built-in ``fedprox`` at the same mu. Not bit for bit: the built-in adds
    the proximal gradient as (g - mu theta_g) + mu theta (a correction, then the optimizer's weight decay), the hook
    as g + mu (theta - theta_g) (autograd of its term): the same sum rounded in another order. Measured: 1.2e-7 on
    the weights, 9e-9 on the metrics (2.4e-7 and 3e-8 after 5 rounds). Tolerance: 1e-5 on the weights, 1e-6 on the
    metrics; FedAvg (mu = 0) is further than 1e-3 from both, so the tolerance tells the methods apart."""
    import ast

    from helpers import split_labels

    from fedmedbench.data import synthetic
    from fedmedbench.fl.engine import flower as engine
    from fedmedbench.partition import schemes as P
    from fedmedbench.workflow import io

    imported = {n.module for n in ast.walk(ast.parse(FEDPROX_HOOK.read_text())) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "fedmedbench.fl.api"}
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 240, "val": 40, "test": 80})
    io.write_npz(tmp_path / "b.npz", arrays)
    io.write_json(tmp_path / "p.json", P.build_partition(split_labels(arrays), "dirichlet", 3, 0, {"alpha": 1.0}, num_classes=2))

    def run(method: str, params: dict, method_file: Path | None = None) -> tuple[dict, pd.DataFrame]:
        spec = RunSpec(run_dir=str(tmp_path / method), study="t", dataset="breastmnist", setting="dir", method=method,
                       seed=0, partition_path=str(tmp_path / "p.json"), sources={"base": str(tmp_path / "b.npz")},
                       image_size=28, model="cnn_small", method_params=params, device="cpu",
                       method_file=None if method_file is None else str(method_file),
                       train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9})
        engine.run(spec, log=lambda line: None)
        metrics = pd.read_csv(tmp_path / method / "metrics.csv")
        return torch.load(tmp_path / method / "model.pt", weights_only=True), metrics.filter(regex="^(global|local_mean)_")

    def gaps(a, b) -> tuple[float, float]:
        weights = max(float((a[0][k].double() - b[0][k].double()).abs().max()) for k in a[0])
        return weights, float((a[1] - b[1]).abs().max().max())

    built_in, hook = run("fedprox", {"mu": 0.1}), run("fedprox_hook", {"mu": 0.1}, FEDPROX_HOOK)
    assert hook[0].keys() == built_in[0].keys() and list(hook[1]) == list(built_in[1])
    weights, metrics = gaps(hook, built_in)
    assert weights < 1e-5 and metrics < 1e-6, (weights, metrics)
    assert min(gaps(run("fedavg", {}), built_in)) > 1e-3


@pytest.mark.slow
def test_readme_own_method_example_runs_end_to_end_and_an_edit_reruns_it(tmp_path):
    """The README's example from a folder outside src/: the config names the file, Snakemake plans and runs
    a 2-round federation with it on synthetic data, and editing the file plans that run again."""
    from helpers import copy_workflow

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own method", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    assert "examples/methods/fednova.py" in section
    work = copy_workflow(tmp_path / "work")
    (work / "examples" / "methods").mkdir(parents=True)
    shutil.copy(FEDNOVA, work / "examples" / "methods" / "fednova.py")
    micro = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())
    cfg = {**copy.deepcopy(micro), **yaml.safe_load(snippet)}
    study = cfg["studies"]["mine"]
    study.update(datasets=["breastmnist"], seeds=[0], settings={"dir": micro["studies"]["micro"]["settings"]["dir"]},
                 train=micro["studies"]["micro"]["train"])
    cfg["studies"] = {"mine": study}
    (work / "mine.yaml").write_text(yaml.safe_dump(cfg))
    target = "results/mine/breastmnist/dir/fednova/seed0/metrics.csv"

    def snakemake(*args):
        return subprocess.run([sys.executable, "-m", "snakemake", target, "--cores", "2", "--configfile", "mine.yaml", *args],
                              cwd=work, capture_output=True, text=True, timeout=600)

    proc = snakemake()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    metrics = pd.read_csv(work / target)
    assert metrics["round"].max() == 2 and metrics["global_accuracy"].notna().all()
    proc = snakemake("-n")
    assert "train_federated" not in proc.stdout, proc.stdout[-2000:]
    nova = work / "examples" / "methods" / "fednova.py"
    nova.write_text(nova.read_text() + "# an edit\n")
    proc = snakemake("-n")
    assert proc.returncode == 0 and re.search(r"train_federated\s+1", proc.stdout), proc.stdout[-3000:] + proc.stderr[-3000:]
