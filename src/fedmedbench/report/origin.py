"""Where a table's numbers come from, in words: one helper so every caption says it the same way.

A study's origin is ``synthetic``, ``real`` (official MedMNIST files) and/or ``user data: <path>``
for each of the user's own datasets, joined by ``"; "``.
"""

from __future__ import annotations

SYNTHETIC_NOTE = "SYNTHETIC data (deterministic stand-in for the demo; NOT a reproduction of any paper's numbers)"


def parts(origin: str) -> list[str]:
    return [p.strip() for p in str(origin).split(";") if p.strip()]


def is_synthetic(origin: str) -> bool:
    return "synthetic" in parts(origin)


def source_note(origin: str, synthetic_note: str = SYNTHETIC_NOTE) -> str:
    """``synthetic`` -> the synthetic warning, ``real`` -> official MedMNIST data, user data as given."""
    words = {"synthetic": synthetic_note, "real": "official MedMNIST data"}
    return "; ".join(words.get(p, p) for p in parts(origin))
