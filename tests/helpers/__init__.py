"""Helpers shared by tests."""

import shutil
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
