"""Model arrays: taking them from a model, loading them back, copying them and averaging them.

``Arrays`` maps a model's state_dict keys to torch tensors, from the client's model to the server's
average and back: on the job's device where the inline backend keeps them there (an accelerator, server
and clients in one process), else on the CPU. NumPy arrays appear only where arrays leave the process
(Flower messages: ``fl/engine/flower.py``) and in files.
"""

from __future__ import annotations

import numpy as np
import torch

#: a model's state by key, as torch tensors (see the module docstring for where they live)
Arrays = dict[str, torch.Tensor]


def model_arrays(model: torch.nn.Module, keys: list[str] | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> Arrays:
    """state_dict entries (parameters and buffers) copied to the CPU, in order (``state``: the model's
    state_dict entries already at hand, e.g. from its ``StateSlots``)."""
    return model_tensors(model, keys, state, "cpu")


def model_tensors(model: torch.nn.Module, keys: list[str] | None = None,
                  state: dict[str, torch.Tensor] | None = None, device: torch.device | str | None = None) -> Arrays:
    """state_dict entries copied where they are (or to ``device``): one copy per (device, dtype), each
    entry a view of its group's flat buffer (``state`` as in :func:`model_arrays`)."""
    state = model.state_dict() if state is None else state
    return snapshot({k: state[k] for k in (keys if keys is not None else state)}, device)


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


def moved(arrays: Arrays, device: torch.device | str) -> Arrays:
    """``arrays`` on ``device`` (tensors already there pass through, not copied)."""
    return {k: v.to(device) for k, v in arrays.items()}


def host_copies(arrays: Arrays) -> Arrays:
    """Each entry copied to the CPU into memory of its own (``torch.save`` then writes the entry's own
    bytes, not a buffer it shares), 0-d entries staying 0-d."""
    return {k: v.detach().to("cpu", copy=True) for k, v in arrays.items()}


def host_tensors(arrays: Arrays) -> Arrays:
    """The arrays copied to the host by one transfer per (device, dtype) (:func:`snapshot`: views of one
    buffer each). For what a state file writes (each tensor's own bytes); ``torch.save`` would store the
    shared buffer instead (``model.pt`` keeps :func:`host_copies`)."""
    return snapshot(arrays, "cpu") if arrays else {}


def load_arrays(model: torch.nn.Module, arrays: Arrays, keys: list[str] | None = None) -> None:
    """Load ``arrays`` into the model; ``keys`` (default: all) must all be present, shapes must match."""
    full = model.state_dict()
    keys = list(full) if keys is None else keys
    missing = set(keys) - set(arrays)
    if missing:
        raise KeyError(f"arrays lack model keys: {sorted(missing)[:5]}")
    state = {k: full[k] for k in keys}
    wrong = [k for k in state if tuple(arrays[k].shape) != tuple(state[k].shape)]
    if wrong:
        k = wrong[0]
        raise ValueError(f"array '{k}' has shape {tuple(arrays[k].shape)}, the model expects {tuple(state[k].shape)}")
    model.load_state_dict({k: torch.as_tensor(arrays[k]).to(state[k].dtype) for k in state}, strict=len(state) == len(full))


def weighted_average(arrays: list[Arrays], weights: list[float]) -> Arrays:
    """Weighted mean per key, where the arrays are: per dtype group one flat float64 accumulator,
    ``0 + w_0 a_0 + w_1 a_1 + ...`` term by term in client order, then cast back (integer buffers
    rounded half to even, as ``np.rint``): NumPy's float64 sum of the same terms, bit for bit, on any
    device (``tests/test_cuda.py`` on a GPU)."""
    if not arrays:
        raise ValueError("nothing to aggregate: no client results")
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError(f"aggregation weights must sum to > 0, got {weights}")
    w = w / w.sum()
    first = {k: torch.as_tensor(v) for k, v in arrays[0].items()}
    groups: dict[tuple, list[str]] = {}
    for k, t in first.items():
        groups.setdefault((t.device, t.dtype), []).append(k)
    out: Arrays = {}
    with torch.no_grad():
        for (device, dtype), keys in groups.items():
            sizes = [first[k].numel() for k in keys]
            acc = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
            for wi, a in zip(w, arrays, strict=True):
                flat = torch.cat([torch.as_tensor(a[k]).detach().reshape(-1) for k in keys]).to(device, torch.float64)
                acc.add_(flat.mul_(float(wi)))
            if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
                acc = torch.round(acc)
            for k, piece in zip(keys, acc.to(dtype).split(sizes), strict=True):
                out[k] = piece.view(first[k].shape)
    return {k: out[k] for k in first}
