"""Ultralytics' dataset caches (``labels.cache``) in a format that is never unpickled.

Ultralytics saves the labels it scanned as a pickled dict (``np.save`` of an object array) and loads it
back with ``np.load(..., allow_pickle=True)``: a crafted cache in a run's ``work/`` folder would run code
when a killed run resumes and Ultralytics finds it. :func:`install` replaces Ultralytics' two cache
functions: a cache is written as an uncompressed npz of two plain arrays, the structure as JSON text
and every array's bytes in one buffer, and read back with ``allow_pickle=False``. Anything else found
under a cache's name (an old pickled cache, a crafted file, a truncated one) fails to load, and
Ultralytics then scans the labels again and writes a cache of this format in its place.

The decoded cache equals the one Ultralytics built: the same keys, lists, tuples, strings and numbers,
and arrays of the same dtype, shape and bytes (``tests/test_bad_inputs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedmedbench.workflow.io import atomic_path

#: marks the format (a cache without it is not read)
FORMAT = "fedmedbench-label-cache-1"


class LabelCacheError(ValueError):
    """A file under a cache's name that is not a cache of this format (Ultralytics then rescans)."""


def _encode(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise TypeError("an object array cannot be stored without pickling")
        arrays.append(arr)
        return {"a": len(arrays) - 1, "scalar": isinstance(obj, np.generic)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("cache keys must be strings")
        return {"d": {k: _encode(v, arrays) for k, v in obj.items()}}
    if isinstance(obj, list | tuple):
        return {"l" if isinstance(obj, list) else "t": [_encode(v, arrays) for v in obj]}
    raise TypeError(f"cannot store a {type(obj).__name__} in a label cache")


def _decode(node: Any, arrays: list[np.ndarray]) -> Any:
    if not isinstance(node, dict):
        return node
    if "a" in node:
        arr = arrays[node["a"]]
        return arr[()] if node["scalar"] else arr
    if "d" in node:
        return {k: _decode(v, arrays) for k, v in node["d"].items()}
    if "l" in node:
        return [_decode(v, arrays) for v in node["l"]]
    return tuple(_decode(v, arrays) for v in node["t"])


def dump(obj: dict, path: str | Path) -> None:
    """Write ``obj`` (dicts, lists, tuples, plain scalars, non-object arrays) atomically to ``path``."""
    arrays: list[np.ndarray] = []
    tree = _encode(obj, arrays)
    table, offset = [], 0
    for arr in arrays:
        table.append([arr.dtype.str, list(arr.shape), offset])
        offset += arr.nbytes
    blob = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]) if arrays \
        else np.zeros(0, np.uint8)
    text = json.dumps({"format": FORMAT, "tree": tree, "arrays": table})
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, structure=np.frombuffer(text.encode(), np.uint8), data=blob)


def load(path: str | Path) -> dict:
    """Read a cache written by :func:`dump`; anything else raises (no pickle is ever loaded)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            doc = json.loads(npz["structure"].tobytes().decode())
            blob = npz["data"]
    except FileNotFoundError:
        raise
    except Exception as exc:  # a pickle (refused), a truncated or foreign file
        raise LabelCacheError(f"{path}: not a label cache of this workflow ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LabelCacheError(f"{path}: not a label cache of this workflow (no '{FORMAT}' mark)")
    arrays = []
    try:
        for dtype, shape, offset in doc["arrays"]:
            dt = np.dtype(dtype)
            if dt.hasobject:
                raise LabelCacheError(f"{path}: an object array in a label cache")
            count = int(np.prod(shape, dtype=np.int64))
            arrays.append(np.frombuffer(blob, dt, count, int(offset)).reshape(shape).copy())
        return _decode(doc["tree"], arrays)
    except LabelCacheError:
        raise
    except Exception as exc:
        raise LabelCacheError(f"{path}: damaged label cache ({type(exc).__name__}: {exc})") from None


def save_dataset_cache_file(prefix: str, path: Path, x: dict, version: str) -> None:
    """Ultralytics' ``save_dataset_cache_file`` in this format (the same version key, messages and failures)."""
    from ultralytics.utils import LOGGER

    x["version"] = version
    try:
        dump(x, path)
        LOGGER.info(f"{prefix}New cache created: {path}")
    except Exception as exc:  # as Ultralytics: a cache that cannot be written is only a warning
        LOGGER.warning(f"{prefix}Failed to save cache to {path}: {exc}")


def install() -> None:
    """Route Ultralytics' dataset caches through this format (idempotent; before any dataset is built)."""
    import ultralytics.data.dataset as dataset
    import ultralytics.data.utils as utils

    for module in (dataset, utils):
        module.load_dataset_cache_file = load
        module.save_dataset_cache_file = save_dataset_cache_file
