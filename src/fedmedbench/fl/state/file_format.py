"""Client-state files written without holding the GIL.

A client state (SCAFFOLD's c_i, FedDyn's h_i, ...) is a ConvNeXtV2-nano-sized set of tensors that
the server checkpoint writes in its background thread while the next round trains. ``torch.save``
copies every storage into its zip writer with the GIL held (about 35 ms per 62 MB state on the
development machine), and a GPU round's training loop is Python that needs the GIL to launch each
kernel: ten such states per round stall it for a third of a second. Here the tensors' bytes go
from their memory to the file and to sha256 through calls that release the GIL (``write`` and
``hashlib`` on buffers), and only a small JSON header is built in Python.

The layout is safetensors' (an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes), so the ``safetensors`` package reads the
tensors too. The state's structure (nested dicts, lists, tuples, plain values, which tensors are
parameters and need gradients) is kept in the header's metadata, so :func:`read_state` returns
what ``torch.load`` of a ``torch.save`` file would. A state holding anything else is written with
``torch.save`` as before; :func:`read_state` reads both (a ``torch.save`` file is a zip archive).
No pickle is ever read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch

from fedmedbench.workflow.io import atomic_path, disk_full_error, write_torch

#: torch dtype <-> safetensors dtype name
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
NAMES = {name: dtype for dtype, name in DTYPES.items()}
TREE_KEY = "fedmedbench.state"
ZIP_MAGIC = b"PK\x03\x04"


class StateFileError(ValueError):
    """A state file that is not a readable state (the message names the file)."""


class _Unsupported(Exception):
    """A value the layout does not describe: the state is written with ``torch.save`` instead."""


def _encode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """The state's structure as JSON, tensors replaced by their index in ``tensors``."""
    if isinstance(obj, torch.Tensor):
        if obj.dtype not in DTYPES or obj.is_sparse or obj.is_quantized:
            raise _Unsupported(obj.dtype)
        tensors.append(obj)
        return {"T": len(tensors) - 1, "P": isinstance(obj, torch.nn.Parameter), "G": bool(obj.requires_grad)}
    if isinstance(obj, dict):
        if not all(type(k) in (str, int) for k in obj):
            raise _Unsupported("key")
        return {"D": [[k, _encode(v, tensors)] for k, v in obj.items()]}
    if type(obj) in (list, tuple):
        return {"L" if type(obj) is list else "U": [_encode(v, tensors) for v in obj]}
    if obj is None or type(obj) in (bool, int, str):
        return {"V": obj}
    if type(obj) is float:  # JSON has no NaN or infinities: those go as text, the rest by repr (exact)
        return {"F": repr(obj)} if not math.isfinite(obj) else {"V": obj}
    raise _Unsupported(type(obj))


def _decode(node: dict, tensors: list[torch.Tensor]) -> Any:
    if "T" in node:
        t = tensors[node["T"]]
        if node["P"]:
            return torch.nn.Parameter(t, requires_grad=node["G"])
        return t.requires_grad_(node["G"])
    if "D" in node:
        return {k: _decode(v, tensors) for k, v in node["D"]}
    if "L" in node:
        return [_decode(v, tensors) for v in node["L"]]
    if "U" in node:
        return tuple(_decode(v, tensors) for v in node["U"])
    if "F" in node:
        return float(node["F"])
    return node["V"]


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order, as a buffer (no copy for a contiguous CPU tensor)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def write_state(target: str | Path, state: Any, what: str = "client state") -> str:
    """Write ``state`` atomically; returns the sha256 of the bytes written."""
    tensors: list[torch.Tensor] = []
    try:
        tree = _encode(state, tensors)
    except _Unsupported:
        return write_torch(target, state, what)
    buffers = [_bytes_of(t) for t in tensors]
    header: dict[str, Any] = {"__metadata__": {TREE_KEY: json.dumps(tree, separators=(",", ":"))}}
    offset = 0
    for i, (t, buf) in enumerate(zip(tensors, buffers, strict=True)):
        header[str(i)] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + buf.nbytes]}
        offset += buf.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    digest = hashlib.sha256()
    target = Path(target)
    try:
        with atomic_path(target) as tmp, open(tmp, "wb") as fh:
            for part in (struct.pack("<Q", len(text)), text, *buffers):
                fh.write(part)  # both release the GIL for a large buffer
                digest.update(part)
    except OSError as exc:
        full = disk_full_error(exc, target, what, offset + len(text) + 8)
        if full is not None:
            raise full from exc
        raise
    return digest.hexdigest()


def read_state(path: str | Path) -> Any:
    """The state a file holds, written by :func:`write_state` or by ``torch.save`` (tensors on the CPU)."""
    path = Path(path)
    with open(path, "rb") as fh:  # one copy, into an uninitialised buffer the tensors then share
        buffer = torch.empty(os.fstat(fh.fileno()).st_size, dtype=torch.uint8)
        data = memoryview(buffer.numpy())
        got = fh.readinto(data)
    if got != len(data):
        raise StateFileError(f"{path}: not a readable state file (it changed while being read)")
    if data[:4] == ZIP_MAGIC:
        import io

        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(bytes(data[8 : 8 + size]))
        tree = json.loads(header.pop("__metadata__")[TREE_KEY])
        start = 8 + size
        tensors = []
        for i in range(len(header)):
            entry = header[str(i)]
            begin, end = entry["data_offsets"]
            dtype = NAMES[entry["dtype"]]
            if not 0 <= begin <= end <= len(data) - start:
                raise ValueError(f"tensor {i} lies outside the file")
            raw = buffer[start + begin : start + end]
            # a view of the file's buffer where aligned; a copy where the dtype needs alignment it lacks
            raw = raw if (start + begin) % dtype.itemsize == 0 else raw.clone()
            tensors.append(raw.view(dtype).reshape(entry["shape"]))
        if start + (max((header[k]["data_offsets"][1] for k in header), default=0)) != len(data):
            raise ValueError("the file is longer or shorter than its header says")
        return _decode(tree, tensors)
    except (ValueError, KeyError, IndexError, TypeError, RuntimeError, struct.error) as exc:
        raise StateFileError(f"{path}: not a readable state file ({type(exc).__name__}: {exc})") from exc
