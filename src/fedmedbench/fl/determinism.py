"""Reproducible GPU kernels for a job (``engine.deterministic``).

On the CPU torch's kernels give the same bits on every run. On a GPU some do not: cuDNN's
convolution backward may accumulate with atomics in whatever order threads finish, so two runs of
one spec (or a run killed and resumed against one that was not) can differ in the last bits, and
training amplifies such differences (Adam's step on near-zero gradients is about ``lr`` whatever
their sign; SAM's perturbation is normalised). Asking for deterministic kernels makes a GPU rerun,
and a resumed run, the same bits as the first; the arithmetic is the same, so results do not
change in expectation (not part of the run hash), but some kernels are slower: off by default.
"""

from __future__ import annotations

import os

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
