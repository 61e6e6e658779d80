"""Shared by the benchmark scripts' command lines: argument types that refuse a bad value in one line."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """An argparse type: a whole number from 1 (0 jobs, rounds, repeats or threads time nothing)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1")
    return value


def whole(text: str) -> int:
    """An argparse type: a whole number from 0 (worker counts: 0 loads in the job's own process)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 0")
    return value


def check_cuda(script: str, device: str) -> None:
    """Exit with one line when ``--device cuda`` is asked for on a machine where torch sees no CUDA device (else the
    first tensor moved there stops the bench in a traceback)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{script}: --device cuda, but torch sees no CUDA device")


def above_zero(text: str) -> float:
    """An argparse type: a number above 0 (0 or fewer local epochs, or a peak of 0 FLOP/s, means nothing here)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value
