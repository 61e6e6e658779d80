"""Why a job reruns, in keys: ``params changed: train.lr 0.05 -> 0.1`` instead of two dumped dicts.

Snakemake reruns a job whose ``params:`` differ from the ones recorded with its outputs, and says
so by printing every differing param value before and now in full (a run's spec is a 1-2 kB dict).
The values it records are ``repr`` strings; :func:`params_diff` reads them back and names the
changed keys, old -> new; ``compat.patch_snakemake_params_reason`` makes Snakemake's reason use it
(display only: which jobs rerun is Snakemake's decision, unchanged).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

#: a changed value longer than this is shortened in the reason
MAX_VALUE_CHARS = 60
#: the changed keys shown before "... and N more"
MAX_KEYS = 8
_UNSET = object()


def _parse(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text  # not a literal (e.g. nan inside): compared as text


def _short(value: Any) -> str:
    if value is _UNSET:
        return "(unset)"
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def _changes(old: Any, new: Any, prefix: str) -> list[str]:
    """``key old -> new`` for every leaf that differs; dicts are walked key by key."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += _changes(old.get(key, _UNSET), new.get(key, _UNSET), name)
        return out
    if old == new and type(old) is type(new):
        return []
    return [f"{prefix or 'value'} {_short(old)} -> {_short(new)}"]


def _overlap(a: Any, b: Any) -> int:
    """How alike two param values are: shared dict items (then shared keys), to pair old with new."""
    if isinstance(a, dict) and isinstance(b, dict):
        return 1 + 2 * sum(1 for k in a if k in b and a[k] == b[k]) + sum(1 for k in a if k in b)
    return 1 if type(a) is type(b) else 0


def params_diff(only_old: Iterable[str], only_new: Iterable[str]) -> str:
    """The changed keys between Snakemake's recorded param values ``only_old`` and the current ``only_new``."""
    olds = [_parse(s) for s in sorted(only_old)]
    news = [_parse(s) for s in sorted(only_new)]
    changes: list[str] = []
    for old in olds:
        if not news:
            changes.append(f"removed {_short(old)}")
            continue
        new = max(news, key=lambda n: _overlap(old, n))
        news.remove(new)
        changes += _changes(old, new, "")
    changes += [f"added {_short(n)}" for n in news]
    if len(changes) > MAX_KEYS:
        changes = changes[:MAX_KEYS] + [f"... and {len(changes) - MAX_KEYS} more"]
    return "; ".join(changes) or "the recorded params differ"

