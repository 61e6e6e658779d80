"""Reproducible GPU kernels for a job (``engine.deterministic``).

On the CPU torch's kernels give the same bits on every run. On a GPU some do not: cuDNN's
convolution backward may accumulate with atomics in whatever order threads finish, so two runs of
one spec (or a run killed and resumed against one that was not) can differ in the last bits, and
training amplifies such differences (Adam's step on near-zero gradients is about ``lr`` whatever
their sign; SAM's perturbation is normalised). Asking for deterministic kernels makes a GPU rerun,
and a resumed run, the same bits as the first; the arithmetic is the same, so results do not
change in expectation (not part of the run hash), but some kernels are slower: off by default.

The random draws of a run are reproducible by their keys: :func:`seeded_generator` makes the one generator
of (run seed, round, stream), the same on every process, device and resume.
"""

from __future__ import annotations

import os

import numpy as np
import torch

#: cuBLAS's fixed workspace configuration under which its kernels are run-to-run deterministic
#: (CUDA >= 10.2; read when the process's first cuBLAS handle is made)
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def use_deterministic_kernels() -> None:
    """Deterministic kernels from here on in this process: cuDNN's deterministic algorithms (chosen
    by its heuristics, not by timing), cuBLAS's fixed workspace (unless the environment already sets
    one), and torch's deterministic implementations where an operation has one. An operation with
    none (e.g. the backward of ``cnn_small``'s adaptive average pooling, which adds with atomics) warns
    instead of failing a long job (``warn_only``), and its runs may still differ."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def seeded_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded by ``keys`` (e.g. run seed, round, client id) through NumPy's SeedSequence:
    every tuple of keys gets its own well-mixed stream, and the same keys draw the same numbers in any process."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0]))
