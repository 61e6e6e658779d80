"""Model arrays: taking them from a model, loading them back, copying them and averaging them.

``Arrays`` maps a model's state_dict keys to NumPy arrays on the host, or, on the inline backend
for a method with ``device_arrays``, to torch tensors on the job's device; every helper here takes
either and keeps the results the same bits.
"""

from __future__ import annotations

import numpy as np
import torch

#: a model's state by key: NumPy arrays on the host; on the inline backend, for a method with
#: ``device_arrays``, torch tensors on the job's device (no host round trip per client)
Arrays = dict[str, np.ndarray]


def model_arrays(model: torch.nn.Module, keys: list[str] | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> Arrays:
    """state_dict entries (parameters and buffers) as numpy arrays on the CPU, in order (``state``: the
    model's state_dict entries already at hand, e.g. from its ``StateSlots``)."""
    state = model.state_dict() if state is None else state
    return {k: state[k].detach().cpu().numpy().copy() for k in (keys if keys is not None else state)}


def model_tensors(model: torch.nn.Module, keys: list[str] | None = None,
                  state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """state_dict entries copied where they are (the device): one copy kernel per dtype, each
    entry a view of its dtype's flat buffer (``state`` as in :func:`model_arrays`)."""
    state = model.state_dict() if state is None else state
    return snapshot({k: state[k] for k in (keys if keys is not None else state)})


def snapshot(tensors: dict[str, torch.Tensor], device: torch.device | str | None = None,
             dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Detached copies of ``tensors`` (same shapes; on ``device`` and as ``dtype``, by default where and
    as each is), made per (device, dtype) group by one copy instead of one per entry: of the memory the
    group already covers back to back (views of one flat buffer, as this function and a state file read
    give), else of one concatenation. Each copy is a view of its group's new flat buffer."""
    groups: dict[tuple, list[str]] = {}
    for k, t in tensors.items():
        groups.setdefault((t.device, t.dtype), []).append(k)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for (where, kind), keys in groups.items():
            parts = [tensors[k].detach() for k in keys]
            target = where if device is None else torch.device(device)
            flat = _tiled(parts)
            if flat is None:  # the concatenation is a new buffer; .to moves or converts it only where asked
                flat = torch.cat([t.reshape(-1) for t in parts]).to(target, dtype or kind)
            else:
                flat = flat.to(target, dtype or kind, copy=True)
            for k, t, piece in zip(keys, parts, flat.split([t.numel() for t in parts]), strict=True):
                out[k] = piece.view(t.shape)
    return {k: out[k] for k in tensors}


def _tiled(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The flat view of the memory ``parts`` cover back to back, in order, in one storage; None otherwise."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    start = end = first.storage_offset()
    for t in parts:
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != storage or t.storage_offset() != end:
            return None
        end += t.numel()
    return first.as_strided((end - start,), (1,), start)


def is_tensor_arrays(arrays: Arrays) -> bool:
    """True when the values are torch tensors (a job that keeps its arrays on the device)."""
    return bool(arrays) and isinstance(next(iter(arrays.values())), torch.Tensor)


def as_tensors(arrays: Arrays, device: torch.device | str) -> dict[str, torch.Tensor]:
    """``arrays`` as tensors on ``device`` (NumPy arrays are copied; tensors already there pass through)."""
    return {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v, order="C", copy=True))).to(device)
            for k, v in arrays.items()}


def arrays_to_tensors(arrays: Arrays) -> dict[str, torch.Tensor]:
    """Arrays -> CPU tensors of the same shape (0-d stays 0-d, unlike ascontiguousarray), owning their memory."""
    return {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor)
            else torch.from_numpy(np.array(v, order="C", copy=True)) for k, v in arrays.items()}


def host_tensors(arrays: Arrays) -> dict[str, torch.Tensor]:
    """:func:`arrays_to_tensors` with the tensor values copied to the host by one transfer per (device,
    dtype) (:func:`snapshot`: views of one buffer each). For what a state file writes (each tensor's own
    bytes); ``torch.save`` would store the shared buffer instead (``model.pt`` keeps
    :func:`arrays_to_tensors`)."""
    copied = snapshot({k: v for k, v in arrays.items() if isinstance(v, torch.Tensor)}, "cpu")
    rest = arrays_to_tensors({k: v for k, v in arrays.items() if k not in copied})
    return {k: copied[k] if k in copied else rest[k] for k in arrays}


def load_arrays(model: torch.nn.Module, arrays: Arrays, keys: list[str] | None = None) -> None:
    """Load ``arrays`` into the model; ``keys`` (default: all) must all be present, shapes must match."""
    full = model.state_dict()
    keys = list(full) if keys is None else keys
    missing = set(keys) - set(arrays)
    if missing:
        raise KeyError(f"arrays lack model keys: {sorted(missing)[:5]}")
    state = {k: full[k] for k in keys}
    wrong = [k for k in state if tuple(np.shape(arrays[k])) != tuple(state[k].shape)]
    if wrong:
        k = wrong[0]
        raise ValueError(f"array '{k}' has shape {np.shape(arrays[k])}, the model expects {tuple(state[k].shape)}")
    model.load_state_dict({k: torch.as_tensor(arrays[k]).to(state[k].dtype) for k in state}, strict=len(state) == len(full))


def weighted_average(arrays: list[Arrays], weights: list[float]) -> Arrays:
    """Weighted mean per key (float64 accumulation); integer buffers are rounded back. Tensor
    arrays are averaged where they are (the device), with the same operations in the same order."""
    if not arrays:
        raise ValueError("nothing to aggregate: no client results")
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError(f"aggregation weights must sum to > 0, got {weights}")
    w = w / w.sum()
    if is_tensor_arrays(arrays[0]):
        return _weighted_average_tensors(arrays, w)
    out: Arrays = {}
    for key in arrays[0]:
        acc = sum(wi * a[key].astype(np.float64) for wi, a in zip(w, arrays, strict=True))
        dtype = arrays[0][key].dtype
        out[key] = np.asarray(np.rint(acc) if np.issubdtype(dtype, np.integer) else acc).astype(dtype)
    return out


def _weighted_average_tensors(arrays: list[dict[str, torch.Tensor]], w: np.ndarray) -> dict[str, torch.Tensor]:
    """:func:`weighted_average` on tensors: per dtype group one flat float64 accumulator,
    ``0 + w_0 a_0 + w_1 a_1 + ...`` term by term as the NumPy path sums, then cast back (integers rounded
    half to even, as ``np.rint``)."""
    first = arrays[0]
    groups: dict[tuple, list[str]] = {}
    for k, t in first.items():
        groups.setdefault((t.device, t.dtype), []).append(k)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for (device, dtype), keys in groups.items():
            sizes = [first[k].numel() for k in keys]
            acc = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
            for wi, a in zip(w, arrays, strict=True):
                flat = torch.cat([a[k].detach().reshape(-1) for k in keys]).to(torch.float64)
                acc.add_(flat.mul_(float(wi)))
            if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
                acc = torch.round(acc)
            for k, piece in zip(keys, acc.to(dtype).split(sizes), strict=True):
                out[k] = piece.view(first[k].shape)
    return {k: out[k] for k in first}
