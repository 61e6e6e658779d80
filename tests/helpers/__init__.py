"""Helpers shared by tests."""

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_ITEMS = ("Snakefile", "rules", "scripts", "config", "report", "envs", "src")


def copy_workflow(dest: Path) -> Path:
    """A runnable copy of the workflow (as a checkout has it) in ``dest``, for pipeline tests."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in WORKFLOW_ITEMS:
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    return dest


def split_labels(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Flat int labels per split from MedMNIST-format arrays."""
    return {s: arrays[f"{s}_labels"].reshape(-1).astype(np.int64) for s in ("train", "val", "test")}


def schema_error(cfg: dict, path: list, value, schema: dict) -> str:
    """Set ``cfg[path...] = value`` on a deep copy and return the schema validation error text."""
    import copy

    import pytest
    from snakemake.utils import validate

    cfg = copy.deepcopy(cfg)
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(Exception) as info:
        validate(cfg, schema)
    return str(info.value)


class Killed(Exception):
    """Raised where :func:`kill_after_round` kills a run."""


def kill_after_round(monkeypatch, rnd: int) -> Callable[[], None]:
    """Make every engine run die (``Killed``) right after round ``rnd`` is finished and its checkpoint taken, as
    a process killed then would; returns the undo (runs resume from that checkpoint afterwards)."""
    from fedmedbench.fl.engine import federation as fed

    finish = fed.Federation.finish_round

    def killed(self, state, r, *args, **kwargs):
        new = finish(self, state, r, *args, **kwargs)
        if r == rnd:
            raise Killed
        return new

    monkeypatch.setattr(fed.Federation, "finish_round", killed)
    return lambda: monkeypatch.setattr(fed.Federation, "finish_round", finish)
