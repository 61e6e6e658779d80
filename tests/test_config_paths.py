"""Every way a config reaches Snakemake ends a bad one in one line naming the file, key or command-line flag: a
user profile's ``configfile`` (alias bomb, target), study names Snakemake or the file system cannot take, a bad
``--config`` value."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmedbench.config.check import MAX_EXPANDED_NODES

ROOT = Path(__file__).resolve().parents[1]
BOMB_LINE = f"its anchors and aliases (&name, *name) expand to more than {MAX_EXPANDED_NODES:,} values"


def mapping_bomb(path: Path) -> Path:
    """9 levels of 10 mapping aliases: 10^9 values once Snakemake's config merge walks them."""
    lines = ["a0: &a0 {" + ", ".join(f"k{j}: lol" for j in range(10)) + "}"]
    lines += [f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + "}" for i in range(1, 10)]
    path.write_text("\n".join(lines) + "\n")
    return path


def profile(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(text)
    return folder


def snakemake(*args: str, env: dict | None = None, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """``snakemake -n ARGS`` in the checkout: its result and how long it took (a hang fails the test)."""
    start = time.monotonic()
    run_env = {k: v for k, v in os.environ.items() if k not in ("FEDMEDBENCH_DEBUG", "SNAKEMAKE_PROFILE")}
    try:
        proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, env={**run_env, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"snakemake {' '.join(args)} did not stop within {timeout} s")
    return proc, time.monotonic() - start


# ---------------------------------------------------------------- a user profile's configfile


def test_a_profiles_alias_bomb_is_one_line_naming_the_file_and_profile(tmp_path, capsys, monkeypatch):
    from fedmedbench.config.cmdline import check_command_line

    bomb = mapping_bomb(tmp_path / "bomb.yaml")
    prof = profile(tmp_path / "prof", f"configfile: {bomb}\n")
    for argv, env in ((["--profile", str(prof)], None), ([], str(prof))):
        if env:
            monkeypatch.setenv("SNAKEMAKE_PROFILE", env)
        start = time.monotonic()
        with pytest.raises(SystemExit) as stop:
            check_command_line(argv)
        assert stop.value.code == 1 and time.monotonic() - start < 60  # the merge it spares runs for hours
        err = capsys.readouterr().err
        assert err == f"config error: {bomb}: {BOMB_LINE}; a config of this workflow holds a few thousand at most " \
                      f"(refused: expanding it would take the memory and time of its expanded size) (configfile of " \
                      f"profile {prof / 'config.yaml'})\n"
    monkeypatch.delenv("SNAKEMAKE_PROFILE")
    check_command_line(["--profile", str(prof), "--configfile", str(ROOT / "config" / "config.yaml")])  # replaced
    assert capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--profile", "SNAKEMAKE_PROFILE"])
def test_snakemake_refuses_a_profiles_alias_bomb_in_seconds(tmp_path, how):
    """The profile's config files are merged by Snakemake's command-line parsing like --configfile's: this hung."""
    bomb = mapping_bomb(tmp_path / "bomb.yaml")
    prof = profile(tmp_path / "prof", f"configfile: {bomb}\n")
    args, env = (["--profile", str(prof)], None) if how == "--profile" else ([], {"SNAKEMAKE_PROFILE": str(prof)})
    proc, took = snakemake(*args, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert [line for line in out.splitlines() if "config error" in line] == [
        line for line in out.splitlines() if line.startswith(f"config error: {bomb}: {BOMB_LINE}")], out
    assert out.count("config error") == 1 and f"(configfile of profile {prof / 'config.yaml'})" in out
    assert took < 50


def test_of_two_profiles_the_one_snakemake_takes_its_config_files_from_is_named(tmp_path, capsys):
    """Snakemake >= 9.27 merges every --profile (a later one's keys win), older releases read the last one only:
    the bomb of the first profile is refused where Snakemake would read it, and named with its profile."""
    from snakemake.cli import get_argument_parser

    from fedmedbench.config.cmdline import check_command_line

    bomb = mapping_bomb(tmp_path / "bomb.yaml")
    with_bomb = profile(tmp_path / "with_bomb", f"configfile: {bomb}\n")
    plain = profile(tmp_path / "plain", "latency-wait: 5\n")
    merges = isinstance(get_argument_parser().parse_known_args(["--profile", "a", "--profile", "b"])[0].profile, list)
    for order in ([with_bomb, plain], [plain, with_bomb]):
        argv = [arg for prof in order for arg in ("--profile", str(prof))]
        if merges or order[-1] == with_bomb:
            with pytest.raises(SystemExit):
                check_command_line(argv)
            assert capsys.readouterr().err.endswith(f"(configfile of profile {with_bomb / 'config.yaml'})\n")
        else:
            check_command_line(argv)
            assert capsys.readouterr().err == ""


@pytest.mark.parametrize("configfile", ["[config/studies/gpaf.yaml, all]", "config/studies/gpaf.yaml all"],
                         ids=["a list", "one string"])
def test_a_target_in_a_profiles_configfile_is_one_line(tmp_path, capsys, configfile):
    """Snakemake opens the target as a config file, a 27-line traceback; the check says where targets go."""
    from fedmedbench.config.cmdline import check_command_line

    prof = profile(tmp_path / "prof", f"configfile: {configfile}\n")
    with pytest.raises(SystemExit):
        check_command_line(["-n", "--profile", str(prof)])
    err = capsys.readouterr().err
    target = "all" if configfile.startswith("[") else configfile
    assert err == (f"config error: {target}: cannot read the config file (No such file or directory); if '{target}' is "
                   f"a target, give it on the command line (snakemake {target} --profile ...), not in the profile "
                   f"(configfile of profile {prof / 'config.yaml'})\n")


@pytest.mark.slow
def test_snakemake_with_a_target_in_a_profiles_configfile_prints_one_line(tmp_path):
    prof = profile(tmp_path / "prof", "configfile: [config/studies/gpaf.yaml, all]\n")
    proc, _ = snakemake("--profile", str(prof))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert out.count("config error: all: cannot read the config file") == 1 and len(out.strip().splitlines()) <= 2


@pytest.mark.slow
def test_a_list_bomb_without_the_workflow_profile_is_refused_by_the_workflow(tmp_path):
    """--workflow-profile none skips the profile's check; a list bomb (which Snakemake's merge does not walk) is then
    refused by the Snakefile's own check. A mapping bomb on that path is the documented limit (docs/reliability.md)."""
    bomb = tmp_path / "lists.yaml"
    lines = ["a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    bomb.write_text("\n".join(lines) + "\n")
    proc, _ = snakemake("--workflow-profile", "none", "--configfile", str(bomb))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out and out.count(f"{bomb}: {BOMB_LINE}") == 1, out


# ---------------------------------------------------------------- study names Snakemake or the file system cannot take


def _micro_with_study(name: str) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "tests" / "fixtures" / "micro.yaml").read_text())
    cfg["studies"] = {name: cfg["studies"]["micro"]}
    return cfg


RANDOM_301 = "s" + "".join(__import__("random").Random(0).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=300))
BAD_NAMES = [
    ("a" * 5000, "studies.aaaaaaaaaaaaaaaaaaaaaaaa…", "a name of 5,000 characters; at most 64"),  # YAML's own limit is 1024
    ("ab" * 500, "studies.abababababababababababab…", "a name of 1,000 characters; at most 64"),  # PeriodicWildcardError
    (RANDOM_301, f"studies.{RANDOM_301[:24]}…", "a name of 301 characters; at most 64"),  # File name too long, at a job
    ("s" + "ab" * 20, "studies.s" + "ab" * 20, "the name ends in 'ab' repeated 20 times or more"),  # short, periodic
]


@pytest.mark.parametrize("name,key,detail", BAD_NAMES[:3], ids=["5000", "periodic 1000", "random 301"])
def test_a_study_name_past_the_schema_limit_is_named_in_one_line(name, key, detail):
    from fedmedbench.config.check import ConfigError
    from fedmedbench.workflow.diagnostics import validate_config

    with pytest.raises(ConfigError) as err:
        validate_config(_micro_with_study(name), ROOT / "config" / "schema.yaml")
    assert err.value.key == key and err.value.detail.startswith(detail)
    cfg = _micro_with_study("micro")
    cfg["studies"]["micro"]["settings"][name] = cfg["studies"]["micro"]["settings"].pop("dir")  # a setting's name too
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, ROOT / "config" / "schema.yaml")
    assert err.value.key == f"studies.micro.settings.{key.split('.', 1)[1]}" and err.value.detail.startswith(detail)


def test_snakemakes_periodic_wildcard_rule_is_the_one_checked():
    from fedmedbench.config.check import periodic_name

    assert periodic_name("s" + "ab" * 20) == "ab" and periodic_name("s" + "ab" * 19) is None
    assert periodic_name("x" + "a" * 20) == "a" and periodic_name("micro") is None and periodic_name("dir0.5") is None


def test_a_key_past_yamls_limit_says_so(tmp_path):
    """A plain YAML key of 5,000 characters: PyYAML's message alone ('mapping values are not allowed here') says
    nothing of why."""
    from fedmedbench.config.check import ConfigFileError, check_file

    text = (ROOT / "tests" / "fixtures" / "micro.yaml").read_text().replace("  micro:\n", "  " + "a" * 5000 + ":\n")
    (path := tmp_path / "long.yaml").write_text(text)
    with pytest.raises(ConfigFileError) as err:
        check_file(path)
    assert str(err.value) == (f"{path}:13:5003: a key of 5,000 characters ('{'a' * 24}…'): YAML reads keys of at most "
                              "1,024 characters, and a study or setting name is at most 64")


@pytest.mark.slow
@pytest.mark.parametrize("name,key,detail", BAD_NAMES, ids=["5000", "periodic 1000", "random 301", "periodic 41"])
def test_snakemake_refuses_a_bad_study_name_at_planning_in_one_line(tmp_path, name, key, detail):
    import yaml

    (path := tmp_path / "names.yaml").write_text(yaml.safe_dump(_micro_with_study(name), width=10**9))
    proc, _ = snakemake("--configfile", str(path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out and "WildcardError in rule" not in out, out[-2000:]
    lines = [line for line in out.splitlines() if "config error" in line]
    assert len(lines) == 1 and lines[0].startswith(f"config error in {path} at '{key}': {detail}"), out[-2000:]
    assert len(lines[0]) < 300


# ---------------------------------------------------------------- a bad value given with --config


def test_a_key_the_command_line_sets_is_named_as_config(monkeypatch, tmp_path):
    from fedmedbench.config.check import ConfigError
    from fedmedbench.workflow import diagnostics

    (conf := tmp_path / "c.yaml").write_text("fedst:\n  eval: {batch_size: 2}\ndevice: cpu\n")
    overrides = {"fedst": {"eval": {"metrics_device": "cuda"}}}
    assert diagnostics.key_file("fedst.eval.metrics_device", [conf], overrides) == "--config"
    assert diagnostics.key_file("fedst.eval.batch_size", [conf], {"fedst": {"enabled": True}}) == str(conf)
    assert diagnostics.key_file("device", [conf], {"device": "cuda"}) == "--config"  # --config is merged last
    for name in (diagnostics.CONFIG_ARGS_ENV, diagnostics.CONFIGFILES_ENV):
        monkeypatch.delenv(name, raising=False)  # undone after the test
    diagnostics.announce([conf], overrides)  # what the Snakefile does; its jobs inherit it
    line = diagnostics.config_error_line(ConfigError("fedst.eval.metrics_device", "'cuda' is not one of"), [conf])
    assert line == "config error in --config at 'fedst.eval.metrics_device': 'cuda' is not one of"


@pytest.mark.slow
def test_snakemake_names_config_for_a_bad_value_given_there():
    proc, _ = snakemake("--config", 'fedst={"eval": {"metrics_device": "cuda"}}')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert [line for line in out.splitlines() if "config error" in line] == [
        "config error in --config at 'fedst.eval.metrics_device': 'cuda' is not one of ['auto', 'cpu', 'torch']"], out
