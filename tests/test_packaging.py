"""Packaging: the pin files agree (envs/environment.yaml, the conda route, and envs/requirements.txt pin each
package at the version envs/constraints.txt, the pip route of `make venv`, pins: both routes install the same
stack), and pyproject.toml installs without a deprecation warning of its own."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "envs"
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503): case and runs of - _ . do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines: list[str]) -> dict[str, str]:
    """``name==version`` lines (extras, comments and markers aside) by canonical name."""
    out = {}
    for line in lines:
        m = PIN.match(line)
        if m:
            out[canonical(m.group(1))] = m.group(3)
    return out


def conda_pins(text: str) -> dict[str, str]:
    """The pip pins of a conda environment file."""
    deps = yaml.safe_load(text)["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    return pins(pip)


def disagreements(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [f"{name}: {a[name]} vs {b[name]}" for name in sorted(set(a) & set(b)) if a[name] != b[name]]


CONSTRAINTS = pins((ENVS / "constraints.txt").read_text().splitlines())


def test_the_conda_environment_pins_what_the_constraints_pin():
    conda = conda_pins((ENVS / "environment.yaml").read_text())
    assert "snakemake" in conda and "flwr" in conda
    assert disagreements(conda, CONSTRAINTS) == []
    assert sorted(set(conda) - set(CONSTRAINTS)) == []  # a pin the constraints lack could drift unseen


#: envs/requirements.txt lines the conda environment (for running the workflow) leaves out: the test tools
DEVELOPMENT_ONLY = {"pytest", "pytest-xdist", "ruff"}


def test_the_conda_environment_holds_every_direct_dependency_but_the_test_tools():
    conda = conda_pins((ENVS / "environment.yaml").read_text())
    direct = {canonical(m.group(1)) for line in (ENVS / "requirements.txt").read_text().splitlines()
              if (m := re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line))}
    assert sorted(direct - set(conda) - DEVELOPMENT_ONLY) == []


def test_the_requirements_pins_are_the_constraints():
    assert disagreements(pins((ENVS / "requirements.txt").read_text().splitlines()), CONSTRAINTS) == []


def test_the_check_sees_a_drift():
    """The drift it was written for: the conda file at snakemake 9.16.3, the constraints at 9.17.0."""
    conda = conda_pins("dependencies:\n  - pip\n  - pip:\n      - flwr[simulation]==1.41.0\n      - Snake_Make==9.16.3\n")
    assert conda == {"flwr": "1.41.0", "snake-make": "9.16.3"}
    constraints = pins(["snake-make==9.17.0  # a comment", "flwr==1.41.0", "# snake-make==1.0"])
    assert disagreements(conda, constraints) == ["snake-make: 9.16.3 vs 9.17.0"]


def test_pyproject_reads_without_a_warning():
    """setuptools reads the project table as `pip install -e .` does (`make venv`) and warns of nothing: the
    license is an SPDX string (a TOML table was deprecated, three warnings of 15 lines each per install)."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "MIT"


def _newest_script():
    """envs/newest.py (`make test-latest`), imported from its file: it is a script, not part of the package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("envs_newest", ENVS / "newest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_newest_requirements_pin_each_direct_dependency_at_its_newest_release_but_the_kept():
    newest = _newest_script()
    lines, bare = newest.at_newest(["# a comment", "torch==2.13.0", "flwr[simulation]==1.41.0", "Snake_Make",
                                    "medpy==0.5.2  # why", ""], {"torch"}, {"flwr": "1.42.0", "Snake_Make": "9.27.1",
                                                                         "medpy": "0.5.3"}.__getitem__)
    assert lines == {"torch": "torch==2.13.0", "flwr": "flwr[simulation]==1.42.0", "snake-make": "Snake_Make==9.27.1",
                     "medpy": "medpy==0.5.3"}
    assert bare["flwr"] == "flwr[simulation]" and bare["snake-make"] == "Snake_Make"


def test_the_newest_requirements_hold_back_the_pin_another_newest_release_depends_on():
    """pip's account of a conflict (its ResolutionImpossible text): the pin the other package needs is loosened,
    not the package that needs it; where pip names no dependency, every pin it names is."""
    newest = _newest_script()
    report = ("ERROR: Cannot install -r r.txt (line 9) and medmnist==3.0.2 because these package versions have "
              "conflicting dependencies.\n\nThe conflict is caused by:\n    The user requested medmnist==3.0.2\n"
              "    medmnistc 0.1.0 depends on medmnist==3.0.1\n")
    assert newest.held_back(report, {"medmnist", "medmnistc", "flwr"}) == {
        "medmnist": "medmnistc 0.1.0 depends on it"}
    unexplained = "The conflict is caused by:\n    The user requested Snake_Make==9.27.1\n    The user requested flwr==1\n"
    assert newest.held_back(unexplained, {"snake-make", "torch"}) == {"snake-make": "in the conflict"}
