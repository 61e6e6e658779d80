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
