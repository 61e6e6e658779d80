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
