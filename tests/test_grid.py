"""Grid semantics: per-(setting, method) train overrides, and pooled-data runs planned once and shown in
every setting with the same pooled inputs (fedmedbench.studies.grid, rules/shared_runs.smk)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from fedmedbench.report import tables
from fedmedbench.studies import grid

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = str(ROOT / "config" / "schema.yaml")


def _study(**over) -> dict:
    """A validated study block (schema defaults filled)."""
    study = {
        "datasets": ["bloodmnist"], "seeds": [0, 1], "methods": ["fedavg", "centralized"],
        "settings": {
            "iid": {"scheme": "iid", "num_clients": 4},
            "dir": {"scheme": "dirichlet", "num_clients": 4, "params": {"alpha": 0.1}},
        },
        "train": {"rounds": 2, "local_epochs": 1, "batch_size": 32, "lr": 0.1},
        **over,
    }
    cfg = {"studies": {"s": study}}
    validate(cfg, SCHEMA)
    return cfg["studies"]["s"]


def test_most_specific_train_override_wins_for_its_pair_only():
    st = _study(method_train={"fedavg": {"lr": 0.3}})
    st["settings"]["iid"]["train"] = {"lr": 0.2}
    st["settings"]["iid"]["method_train"] = {"fedavg": {"lr": 0.4, "momentum": 0.9}}
    validate({"studies": {"s": st}}, SCHEMA)
    lr = {(s, m): grid.run_train(st, s, m)["lr"] for s in st["settings"] for m in st["methods"]}
    assert lr == {("iid", "fedavg"): 0.4, ("iid", "centralized"): 0.2, ("dir", "fedavg"): 0.3, ("dir", "centralized"): 0.1}
    momentum = {(s, m): grid.run_train(st, s, m)["momentum"] for s in st["settings"] for m in st["methods"]}
    assert momentum == {("iid", "fedavg"): 0.9, ("iid", "centralized"): 0.0, ("dir", "fedavg"): 0.0,
                        ("dir", "centralized"): 0.0}


def test_a_table_row_trained_with_overridden_hyper_parameters_carries_a_note_naming_them(tmp_path):
    """Hand-made run summaries of a study whose train lr is 0.1: FedAvg in setting dir runs at lr 0.01
    (``settings.dir.method_train``), centralized everywhere with momentum 0.9 (``method_train``). Their rows are
    marked and the note under the table names the keys with both values; the other row is not marked."""
    from types import SimpleNamespace

    st = _study(method_train={"centralized": {"momentum": 0.9}})
    st["settings"]["dir"]["method_train"] = {"fedavg": {"lr": 0.01}}
    validate({"studies": {"s": st}}, SCHEMA)
    overrides = grid.train_overrides(st)
    assert overrides == {"iid": {"centralized": {"momentum": [0.9, 0.0]}},
                         "dir": {"fedavg": {"lr": [0.01, 0.1]}, "centralized": {"momentum": [0.9, 0.0]}}}
    paths = []
    for setting in ("iid", "dir"):
        for method, acc in (("fedavg", 0.8), ("centralized", 0.9)):
            paths.append(tmp_path / f"{setting}-{method}.json")
            paths[-1].write_text(json.dumps({
                "study": "s", "dataset": "bloodmnist", "setting": setting, "method": method, "seed": 0,
                "data_origin": "synthetic", "rounds": 2, "rounds_run": 2, "final": {"global_accuracy": acc}}))
    runs = tables.load_summaries(paths)
    out = SimpleNamespace(csv=tmp_path / "t.csv", md=tmp_path / "t.md", tex=tmp_path / "t.tex")
    tables.write_tables(tables.aggregate(runs, ["global_accuracy"]), runs, out, "s", "synthetic", overrides=overrides)
    md = out.md.read_text()
    rows = [line.split("|")[2:4] for line in md.splitlines() if line.startswith("| bloodmnist")]
    assert [[c.strip() for c in r] for r in rows] == [["iid", "fedavg"], ["iid", "centralized †"], ["dir", "fedavg ‡"],
                                                       ["dir", "centralized †"]]
    assert md.endswith("\n† momentum 0.9 (study: 0.0)\n\n‡ lr 0.01 (study: 0.1)\n")
    csv = pd.read_csv(out.csv, keep_default_na=False)
    assert csv["train_overrides"].tolist() == ["", "momentum 0.9 (study: 0.0)", "lr 0.01 (study: 0.1)",
                                               "momentum 0.9 (study: 0.0)"]
    assert "† momentum 0.9 (study: 0.0). ‡ lr 0.01 (study: 0.1)." in out.tex.read_text()


def test_pair_override_is_checked_by_the_schema_and_the_study():
    st = _study()
    st["settings"]["iid"]["method_train"] = {"fedavg": {"learning_rate": 0.4}}
    with pytest.raises(Exception, match="learning_rate"):
        validate({"studies": {"s": st}}, SCHEMA)
    st["settings"]["iid"]["method_train"] = {"scaffold": {"lr": 0.4}}  # a method, but not one of the study's
    with pytest.raises(ValueError, match=r"studies\.s\.settings\.iid\.method_train\.scaffold"):
        grid.check_config("s", st)


def test_seeds_together_without_clients_together_is_refused_naming_the_key():
    st = _study()
    st["train"]["seeds_together"] = True
    with pytest.raises(ValueError, match=r"'studies\.s\.train\.seeds_together': .*batch_clients: true"):
        grid.check_config("s", st)
    st["train"]["batch_clients"] = True
    grid.check_config("s", st)


@pytest.mark.parametrize(("where", "key"), [
    (("settings", "dir", "train"), r"settings\.dir\.train\.batch_clients"),
    (("method_train", "fedavg"), r"method_train\.fedavg\.batch_clients"),
    (("settings", "iid", "method_train", "fedavg"), r"settings\.iid\.method_train\.fedavg\.batch_clients")])
def test_seeds_together_with_an_override_turning_clients_together_off_is_refused_naming_it(where, key):
    """An override of one setting's or method's train block that turns batch_clients off: those jobs' seeds would
    only take turns in one process; the error names the override's key."""
    st = _study()
    st["train"].update(seeds_together=True, batch_clients=True)
    block = st
    for k in where:
        block = block.setdefault(k, {})
    block["batch_clients"] = False
    with pytest.raises(ValueError, match=rf"'studies\.s\.{key}': train\.seeds_together is on"):
        grid.check_config("s", st)
    block["batch_clients"] = True
    grid.check_config("s", st)


def test_seeds_together_names_the_override_that_wins_where_several_set_clients_together():
    """The error names the block run_train reads batch_clients from: a method's override over its setting's,
    a pair's over the method's."""
    st = _study()
    st["train"].update(seeds_together=True, batch_clients=True)
    st["method_train"] = {"fedavg": {"batch_clients": False}}
    st["settings"]["iid"]["method_train"] = {"fedavg": {"batch_clients": True}}
    st["settings"]["dir"]["train"] = {"batch_clients": True}
    with pytest.raises(ValueError, match=r"'studies\.s\.method_train\.fedavg\.batch_clients': train\.seeds_together"):
        grid.check_config("s", st)
    st["settings"]["dir"]["method_train"] = {"fedavg": {"batch_clients": True}}
    grid.check_config("s", st)


def test_centralized_trains_once_where_its_pooled_inputs_are_the_same():
    st = _study(methods=["fedavg", "local", "centralized"])
    st["settings"].update({
        "qty": {"scheme": "quantity", "num_clients": 4, "params": {"alpha": 0.5}},
        "fls": {"scheme": "fls", "num_clients": 4, "params": {"alpha": 0.1}},          # repeats samples
        "path": {"scheme": "pathological", "num_clients": 4, "params": {"classes_per_client": 1}},  # may drop classes
        "ten": {"scheme": "dirichlet", "num_clients": 10, "params": {"alpha": 0.1}},   # another step budget
        "lr": {"scheme": "iid", "num_clients": 4, "train": {"lr": 0.01}},             # another train block
        "fqty": {"scheme": "fls_quantity", "num_clients": 10, "params": {"alpha": 0.5}},
    })
    assert grid.shared_runs(st) == {
        ("bloodmnist", "dir", "centralized"): "iid",
        ("bloodmnist", "qty", "centralized"): "iid",
        ("bloodmnist", "fqty", "centralized"): "ten",
    }
    trained = grid.trained_runs(st)
    assert len(list(grid.runs(st))) - len(trained) == 3 * 2  # three shown runs x two seeds
    assert {(r["setting"], r["method"]) for r in trained if r["method"] == "centralized"} == {
        ("iid", "centralized"), ("fls", "centralized"), ("path", "centralized"), ("ten", "centralized"),
        ("lr", "centralized")}


def test_a_pair_override_or_the_switch_keeps_centralized_per_setting():
    st = _study()
    st["settings"]["dir"]["method_train"] = {"centralized": {"lr": 0.5}}
    assert grid.shared_runs(st) == {}
    assert grid.shared_runs(_study(shared_centralized=False)) == {}
    assert grid.shared_runs(_study()) == {("bloodmnist", "dir", "centralized"): "iid"}
    augmented = _study(client_augmentation="reference")
    assert grid.shared_runs(augmented) == {("bloodmnist", "dir", "centralized"): "iid"}  # the same reads in both
    augmented["settings"]["dir"]["client_augmentation"] = "none"  # its own reads: trained in its own setting
    assert grid.shared_runs(augmented) == {}


def test_domain_settings_never_share(tmp_path):
    st = _study(settings={
        "a": {"scheme": "domain", "num_clients": 1, "params": {"domains": ["clean"], "alpha": 0.5}},
        "b": {"scheme": "domain", "num_clients": 1, "params": {"domains": ["clean"], "alpha": 0.1}},
    })
    assert grid.shared_runs(st) == {}


def test_pooled_methods_are_the_registered_centralized_ones():
    from fedmedbench.fl.api.registry import get_method

    schema = yaml.safe_load(Path(SCHEMA).read_text())
    names = schema["definitions"]["method_name"]["enum"]
    assert sorted(m for m in names if get_method(m).centralized) == sorted(grid.POOLED_METHODS)


def _write_run(run_dir: Path, setting: str, accuracy: float) -> None:
    run_dir.mkdir(parents=True)
    pd.DataFrame({"round": [1, 2], "global_accuracy": [accuracy / 2, accuracy]}).to_csv(run_dir / "metrics.csv", index=False)
    pd.DataFrame({"round": [2], "client": [0], "local_accuracy": [accuracy]}).to_csv(run_dir / "client_metrics.csv", index=False)
    (run_dir / "model.pt").write_bytes(b"model bytes")
    (run_dir / "summary.json").write_text(json.dumps({
        "study": "s", "dataset": "bloodmnist", "setting": setting, "method": "centralized", "seed": 0,
        "data_origin": "synthetic", "rounds": 2, "rounds_run": 2, "run_hash": "abc", "final": {"global_accuracy": accuracy}}))


def test_the_one_run_is_a_row_of_every_settings_table(tmp_path):
    home, shown = tmp_path / "iid" / "centralized" / "seed0", tmp_path / "dir" / "centralized" / "seed0"
    _write_run(home, "iid", 0.8)
    grid.show_run(home, shown, "dir")
    for name in ("metrics.csv", "client_metrics.csv", "model.pt"):
        assert (shown / name).read_bytes() == (home / name).read_bytes()
    summary = json.loads((shown / "summary.json").read_text())
    assert (summary["setting"], summary["trained_in"], summary["run_hash"]) == ("dir", "iid", "abc")
    runs = tables.load_summaries([home / "summary.json", shown / "summary.json"])
    table = tables.aggregate(runs, ["global_accuracy"])
    assert table[["setting", "method", "global_accuracy_mean"]].values.tolist() == [
        ["iid", "centralized", 0.8], ["dir", "centralized", 0.8]]
    assert tables.caption("s", runs, "synthetic").endswith(
        "Same pooled data, trained once: centralized in dir is the run trained in iid.")


def _shared_config(path: Path) -> Path:
    """The micro config with an IID and a Dirichlet setting of 3 clients, FedAvg and centralized."""
    cfg = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())
    study = cfg["studies"]["micro"]
    study["methods"] = ["fedavg", "centralized"]
    study["settings"] = {"iid": {"scheme": "iid", "num_clients": 3},
                         "dir": {"scheme": "dirichlet", "num_clients": 3, "params": {"alpha": 1.0, "min_size": 5}}}
    study["early_stopping"] = {}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # the settings' order decides where the run trains
    return path


def test_dry_run_plans_centralized_once_and_shows_it_in_the_other_setting(tmp_path):
    """The workflow trains fedavg in both settings and centralized once; the other setting's table reads a copy."""
    f = _shared_config(tmp_path / "cfg.yaml")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "results/micro/tables/final_metrics_synthetic.csv",
                           "--configfile", str(f)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    trained = sorted(set(_outputs(out, "train_federated")))
    shown = sorted(set(_outputs(out, "show_shared_run")))
    base = "results/micro/breastmnist"
    assert trained == [f"{base}/dir/fedavg/seed0", f"{base}/iid/centralized/seed0", f"{base}/iid/fedavg/seed0"], out[-3000:]
    assert shown == [f"{base}/dir/centralized/seed0"], out[-3000:]


def test_the_workflow_writes_the_shown_run_from_the_trained_one(tmp_path):
    """rule show_shared_run (only it allowed) copies the home run into the other setting's folder."""
    from helpers import copy_workflow

    work = copy_workflow(tmp_path / "wf")
    f = _shared_config(work / "cfg.yaml")
    home = work / "results" / "micro" / "breastmnist" / "iid" / "centralized" / "seed0"
    _write_run(home, "iid", 0.7)
    shown = work / "results" / "micro" / "breastmnist" / "dir" / "centralized" / "seed0"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", str(shown.relative_to(work) / "summary.json"),
                           "--allowed-rules", "show_shared_run", "--configfile", str(f)], cwd=work, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((shown / "summary.json").read_text())
    assert (summary["setting"], summary["trained_in"], summary["final"]) == ("dir", "iid", {"global_accuracy": 0.7})
    assert (shown / "model.pt").read_bytes() == (home / "model.pt").read_bytes()


def _outputs(out: str, rule: str) -> list[str]:
    """The run folders a dry run's jobs of ``rule`` write (from their ``output:`` lines)."""
    dirs, current = [], None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("rule ") or line.startswith("localrule "):
            current = line.split()[1].rstrip(":")
        elif line.startswith("output:") and current == rule:
            first = line[len("output:"):].split(",")[0].strip()
            dirs.append(str(Path(first).parent))
    return dirs


def test_copied_study_config_is_not_changed_by_planning():
    st = _study()
    before = copy.deepcopy(st)
    grid.shared_runs(st)
    list(grid.runs(st))
    assert st == before


def _train_resources(out: str, rule: str) -> list[str]:
    """The ``resources:`` line of every planned job of ``rule`` in a dry run's output."""
    lines, found, inside = out.splitlines(), [], False
    for line in lines:
        if line.strip().startswith("rule "):  # a group job's rules are indented
            inside = line.strip() == f"rule {rule}:"
        elif inside and line.strip().startswith("resources:"):
            found.append(line.strip())
    return found


@pytest.mark.parametrize("device,want", [("cuda", "gpu_mem_mb=10000"), ("cpu", "gpu_mem_mb=0")])
def test_earlystop_jobs_declare_their_gpu_memory_so_the_gpu_profile_packs_them(device, want):
    """The paper config's training jobs ask for the GPU memory one of them holds (resources.train_gpu_mem_mb), so
    profiles/gpu's gpu_mem_mb=80000 and gpu=8 run 8 at once; on the CPU they ask for none."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "--configfile", "config/studies/earlystop.yaml",
                           "--config", f"device={device}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    resources = _train_resources(out, "train_federated")
    assert len(resources) == 600 and all(want in r for r in resources), resources[:2]
    assert all(("gpu=1" in r) == (device == "cuda") for r in resources)
    profile = yaml.safe_load((ROOT / "profiles" / "gpu" / "config.yaml").read_text())
    limits = dict(r.split("=") for r in profile["resources"])
    if device == "cuda":
        assert int(limits["gpu_mem_mb"]) // 10000 == int(limits["gpu"]) == 8


def test_a_job_without_a_gpu_memory_figure_takes_the_whole_gpu(tmp_path):
    """The demo config declares none: each job asks for more than any card, which Snakemake caps at the
    profile's gpu_mem_mb, so it runs alone on the GPU."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "--config", "device=cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for rule in ("train_federated", "ultraflwr_train", "fedst_train"):
        resources = _train_resources(out, rule)
        assert resources and all("gpu_mem_mb=10000000" in r for r in resources), (rule, resources[:1])


def test_snakemake_caps_a_whole_gpu_request_at_the_profiles_memory_and_packs_the_others(tmp_path):
    """What the GPU profile relies on, with the Snakemake this project pins: jobs share the gpu_mem_mb limit, and
    a job asking for more (WHOLE_GPU_MB) is capped at the limit and runs alone rather than never."""
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: expand('o{i}.txt', i=range(3))\n"
        "rule r:\n    output: 'o{i}.txt'\n"
        "    resources: gpu=1, gpu_mem_mb=lambda wc: 10_000_000 if wc.i == '2' else 10000\n"
        "    shell: 'python -c \"import time; print(time.time())\" > {output}; sleep 1; "
        "python -c \"import time; print(time.time())\" >> {output}'\n")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "4", "--resources", "gpu=8",
                           "gpu_mem_mb=25000", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = [[float(t) for t in (tmp_path / f"o{i}.txt").read_text().split()] for i in range(3)]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # the two 10000 MB jobs at once
    assert spans[2][0] >= max(spans[0][1], spans[1][1]) or spans[2][1] <= min(spans[0][0], spans[1][0])  # the other alone


def test_the_slurm_profiles_packed_training_groups_the_earlystop_grid_by_eight(tmp_path):
    """profiles/slurm/config.yaml with its commented "packed training" block uncommented (and a partition and
    account set), as a user runs it (--profile), in a dry run of the earlystop grid: 600 training jobs in 75 groups
    of 8, each asking for no GPU count of its own but for gres gpu:1, which the group takes once (its string
    resources are its first job's, its counts the sum). The profile's own options hold (its ``jobs``, which
    Snakemake >= 9.27 requires with a remote executor)."""
    text = (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    head, rest = text.split("# >>> packed training\n")
    block, tail = rest.split("# <<< packed training")
    uncommented = "\n".join(line[2:] for line in block.splitlines())
    profile = tmp_path / "slurm"
    profile.mkdir()
    (profile / "config.yaml").write_text((head + uncommented + "\n" + tail).replace('slurm_partition: "CHANGE_ME"', "slurm_partition: p")
                                         .replace('slurm_account: "CHANGE_ME"', "slurm_account: a"))
    assert yaml.safe_load((profile / "config.yaml").read_text())["groups"] == ["train_federated=train"]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "--profile", str(profile), "--configfile",
                           "config/studies/earlystop.yaml", "--config", "device=cuda"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    groups = out.split("Group job train")[1:]
    assert len(groups) == 75 and all(g.count("rule train_federated:") == 8 for g in groups[:-1])
    resources = _train_resources(out, "train_federated")
    assert len(resources) == 600 and all("gpu=0" in r and "gres=gpu:1" in r for r in resources)


def _seeds_together_config(path: Path, base: Path, **study_over) -> Path:
    """``base`` with its first study's train.seeds_together on, with its clients together (and ``study_over`` set
    on that study)."""
    cfg = yaml.safe_load(base.read_text())
    study = next(iter(cfg["studies"].values()))
    study["train"].update(seeds_together=True, batch_clients=True)
    study.update(study_over)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_seeds_together_plans_one_job_per_method_for_all_its_seeds(tmp_path):
    """train.seeds_together: the earlystop grid's 600 runs are 200 jobs of three seeds each, every seed's files
    their outputs where train_federated would write them, with three runs' GPU memory."""
    f = _seeds_together_config(tmp_path / "es.yaml", ROOT / "config" / "studies" / "earlystop.yaml")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "--configfile", str(f), "--config",
                           "device=cuda"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert _outputs(out, "train_federated") == []
    jobs = _outputs(out, "train_seeds_together_earlystop")
    assert len(jobs) == 200 and len(set(jobs)) == 200 and all(j.endswith("/seed0") for j in jobs)
    resources = _train_resources(out, "train_seeds_together_earlystop")
    assert len(resources) == 200 and all("gpu_mem_mb=30000" in r and "gpu=1" in r for r in resources), resources[:1]
    outputs = [line for line in out.splitlines() if line.strip().startswith("output:")
               and "dermamnist/dir0.01/fedavg/" in line]
    assert len(outputs) == 1 and all(f"dermamnist/dir0.01/fedavg/seed{s}/{n}" in outputs[0] for s in range(3)
                                     for n in ("metrics.csv", "client_metrics.csv", "summary.json", "model.pt"))


def test_seeds_side_by_side_write_each_seeds_run_as_the_workflow_does(tmp_path):
    """The micro study with two seeds and seeds_together: one job trains both, each seed's files in its folder,
    its summary naming its seed; a changed hyper-parameter's rerun reason names each run's key; a setting cannot
    override the switch (the schema refuses it)."""
    from helpers import copy_workflow

    work = copy_workflow(tmp_path / "wf")
    f = _seeds_together_config(work / "cfg.yaml", ROOT / "tests" / "fixtures" / "micro.yaml", seeds=[0, 1],
                               methods=["fedavg"])
    cfg = yaml.safe_load(f.read_text())
    base = "results/micro/breastmnist/dir/fedavg"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", f"{base}/seed0/summary.json",
                           f"{base}/seed1/summary.json", "--configfile", str(f)], cwd=work, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "train_seeds_together_micro" in out and "rule train_federated" not in out
    seeds = [json.loads((work / base / f"seed{s}" / "summary.json").read_text())["seed"] for s in (0, 1)]
    assert seeds == [0, 1]
    assert all((work / base / f"seed{s}" / "model.pt").is_file() for s in (0, 1))
    # a changed hyper-parameter reruns the job, its reason naming each run's changed key (not the specs dumped)
    cfg["studies"]["micro"]["train"]["lr"] = 0.1
    f.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rerun = subprocess.run([sys.executable, "-m", "snakemake", "-n", f"{base}/seed0/summary.json", "--configfile",
                            str(f)], cwd=work, capture_output=True, text=True, timeout=300)
    assert ("reason: Params have changed since last execution: seed0.train.lr 0.05 -> 0.1; seed1.train.lr 0.05 -> 0.1"
            in rerun.stdout + rerun.stderr), (rerun.stdout + rerun.stderr)[-3000:]
    cfg["studies"]["micro"]["train"]["lr"] = 0.05
    cfg["studies"]["micro"]["settings"]["dir"]["train"] = {"seeds_together": False}
    f.write_text(yaml.safe_dump(cfg, sort_keys=False))
    bad = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", str(f)], cwd=work,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "seeds_together" in bad.stdout + bad.stderr


def test_seeds_together_leaves_a_shown_run_to_show_shared_run(tmp_path):
    """The demo's quickstart with seeds_together: its centralized run, pooled alike in both settings, trains once
    (all seeds in one job, at home in iid) and is shown in dir0.1 seed by seed; the other methods: one job each."""
    f = _seeds_together_config(tmp_path / "demo.yaml", ROOT / "config" / "config.yaml")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F",
                           "results/quickstart/bloodmnist/dir0.1/centralized/seed1/summary.json",
                           "results/quickstart/bloodmnist/dir0.1/fedavg/seed0/summary.json", "--configfile", str(f)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    base = "results/quickstart/bloodmnist"
    assert _outputs(out, "show_shared_run") == [f"{base}/dir0.1/centralized/seed1"]
    assert sorted(_outputs(out, "train_seeds_together_quickstart")) == [f"{base}/dir0.1/fedavg/seed0",
                                                                        f"{base}/iid/centralized/seed0"]
    assert _outputs(out, "train_federated") == []
