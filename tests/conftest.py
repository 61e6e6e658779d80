"""Shared fixtures: small synthetic MedMNIST-format files written in the real schema."""

from __future__ import annotations

import collections
import os
import sys

# Before torch is first imported, here and in every process a test starts (they inherit the environment): torch's
# OpenMP threads sleep while they wait for work instead of spinning (libgomp's default). The suite runs two workers
# on two cores beside Snakemake jobs, Flower processes and scripts; a spinning thread takes the core that the
# thread it waits for needs: a 2-round run at 2 threads took 57-72 s beside a busy core, 7.7 s with them asleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest

from fedmedbench.data import synthetic
from fedmedbench.workflow import io


@pytest.fixture(scope="session")
def breast_arrays() -> dict[str, np.ndarray]:
    return synthetic.generate("breastmnist", 28, seed=0, counts={"train": 240, "val": 40, "test": 80})


@pytest.fixture(scope="session")
def breast_npz(tmp_path_factory, breast_arrays):
    path = tmp_path_factory.mktemp("data") / "breastmnist_28.npz"
    io.write_npz(path, breast_arrays)
    return path


@pytest.fixture(scope="session")
def blood_dir(tmp_path_factory):
    """A folder with a small synthetic BloodMNIST (b.npz) and a 4-client FL-Simulator Dirichlet partition (p.json)."""
    from helpers import split_labels

    from fedmedbench.partition import schemes as P

    d = tmp_path_factory.mktemp("blood")
    arrays = synthetic.generate("bloodmnist", 28, seed=0, counts={"train": 240, "val": 40, "test": 80})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "fls", 4, 0, {"alpha": 0.5}, num_classes=8))
    return d


@pytest.fixture(scope="session")
def breast_domains_dir(tmp_path_factory):
    """A folder with a small synthetic BreastMNIST (b.npz) and a 2-client domain partition (p.json): the GPAF study's shape."""
    from helpers import split_labels

    from fedmedbench.partition import schemes as P

    d = tmp_path_factory.mktemp("breast_domains")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 180, "val": 30, "test": 60})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "domain", 2, 0, {"domains": ["a", "b"], "alpha": 1.0},
                                                  num_classes=2))
    return d


@pytest.fixture
def restore_registry():
    """Methods a test registers (user files, an entry point) leave the registry as it was; built-in modules stay
    imported, so they stay registered."""
    from fedmedbench.fl.api.method_source import METHODS_PACKAGE
    from fedmedbench.fl.api.registry import METHODS, USER_MODULE_PREFIX

    saved = set(METHODS)
    yield
    for name in [n for n, cls in METHODS.items() if n not in saved and not cls.__module__.startswith(METHODS_PACKAGE)]:
        del METHODS[name]
    for module in [m for m in sys.modules if m.startswith(USER_MODULE_PREFIX)]:
        del sys.modules[module]


#: the test files that take minutes (live SuperLinks, whole workflows, a real SLURM), longest first as timed file by
#: file on 2 cores. ``make test`` hands whole files to its two workers in the collection's order (``--dist loadfile
#: --no-loadscope-reorder``): these start first and the run ends on short files. xdist's own order (most tests
#: first) left these few-test files for last, one worker on a file of minutes while the other had nothing left.
LONG_FILES = ("test_deployment_surgical.py", "test_report_html.py", "test_bench_cost.py", "test_deployment.py",
              "test_slurm.py", "test_deployment_segmentation.py", "test_engine.py", "test_pipeline.py",
              "test_kill_anywhere.py", "test_surgical_stand_in.py", "test_demo_ordering.py", "test_gpaf_report.py",
              "test_run_lock.py")


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (whose collection the scheduler hands out): the long files first, then every other file
    by its number of tests (xdist's own order); a file's tests keep their order."""
    if not hasattr(config, "workerinput"):
        return
    tests = collections.Counter(item.path.name for item in items)
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -tests[item.path.name]))
