"""One job timed round by round through the engine (shared by the grid-cost scripts)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.fl import engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.base import _task_cached


def time_spec(spec: RunSpec) -> list[float]:
    """Run the job in a fresh run folder (no task cached from an earlier job); seconds of each round,
    from the metric rows' elapsed_s."""
    _task_cached.cache_clear()
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    engine.run(spec, log=lambda m: None)
    elapsed = pd.read_csv(Path(spec.run_dir) / "metrics.csv")["elapsed_s"].to_numpy()
    return np.diff(np.concatenate([[0.0], elapsed])).tolist()
