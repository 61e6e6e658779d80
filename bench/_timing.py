"""One job timed round by round through the engine (shared by the grid-cost scripts)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.base import _task_cached


def progress(message: str) -> None:
    """A timing's progress on stderr, stamped with the wall clock: where a run is stopped at a time limit,
    what it had reached still shows."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def time_spec(spec: RunSpec, log: Callable[[str], None] = progress) -> list[float]:
    """Run the job in a fresh run folder (no task cached from an earlier job), logging every round; seconds
    of each round, from the metric rows' elapsed_s."""
    _task_cached.cache_clear()
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    engine.run(dataclasses.replace(spec, log_every=1), log=log)  # log_every is not hashed: the same job
    elapsed = pd.read_csv(Path(spec.run_dir) / "metrics.csv")["elapsed_s"].to_numpy()
    return np.diff(np.concatenate([[0.0], elapsed])).tolist()


def time_specs_together(specs: list[RunSpec], log: Callable[[str], None] = progress) -> list[float]:
    """The runs side by side in one process (``fl/engine/runs_together.py``), each in a fresh run folder; seconds of
    each round of all of them (they go in step: each round's latest end), from the metric rows' elapsed_s."""
    from fedmedbench.fl.engine.runs_together import run_together

    _task_cached.cache_clear()
    for spec in specs:
        shutil.rmtree(spec.run_dir, ignore_errors=True)
    run_together([dataclasses.replace(s, log_every=1) for s in specs], log=log)
    elapsed = np.max([pd.read_csv(Path(s.run_dir) / "metrics.csv")["elapsed_s"].to_numpy() for s in specs], axis=0)
    return np.diff(np.concatenate([[0.0], elapsed])).tolist()


def steady_s_per_round(per_round: list[float]) -> float:
    """A job's seconds a round: the mean of its rounds after the first (which builds caches), or of the one."""
    return float(np.mean(per_round[1:] if len(per_round) > 1 else per_round))


@contextmanager
def waiting_steps() -> Iterator[None]:
    """Local steps as they were before their copies stopped waiting for the device, for a before/after on
    one machine: batch indices kept on the CPU (indexing data cached on a GPU then copies them with a
    blocking copy every step) and fedst's batches copied with blocking copies. Results are the same bits."""
    from fedmedbench.fl import training
    from fedmedbench.fl.tasks.segmentation import training as segmentation

    saved = training.on_device, segmentation.on_device
    training.on_device = lambda t, device: t  # batch_indices' only use
    segmentation.on_device = lambda t, device: t.to(device)
    try:
        yield
    finally:
        training.on_device, segmentation.on_device = saved
