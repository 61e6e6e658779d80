"""Client-state files (``fl/state/file_format.py``): what ``torch.load`` of a ``torch.save`` file would return,
bit for bit, in safetensors' layout, with the bytes written from the tensors' memory."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from fedmedbench.fl.state.client_state import ClientStateError, ClientStateStore
from fedmedbench.fl.state.file_format import DTYPES, ZIP_MAGIC, StateFileError, read_state, write_state
from fedmedbench.workflow.io import write_torch


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same_state(a, b) -> None:
    """``a`` and ``b`` hold the same structure, types, flags and values, bit for bit."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad)
        assert _bytes(a) == _bytes(b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same_state(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same_state(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    tensors = {str(dtype): (torch.randn(3, 5, generator=g) * 100).to(dtype) for dtype in DTYPES}
    return {
        "c_i": tensors,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "odd": torch.ones(3, dtype=torch.bool),  # 3 bytes: the next float64 starts unaligned
        "after_odd": torch.arange(4, dtype=torch.float64) / 3,
        "transposed": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        "param": torch.nn.Parameter(torch.ones(2)),
        "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "grad": torch.zeros(2, requires_grad=True),
        3: [1, 2.5, -0.0, 5e-324, float("inf"), float("-inf"), float("nan"), None, True, "x", (1, "y")],
    }


def test_a_state_reads_back_as_torch_save_would_give_it(tmp_path):
    state = _state()
    digest = write_state(tmp_path / "s.pt", state)
    write_torch(tmp_path / "t.pt", state)
    got = read_state(tmp_path / "s.pt")
    same_state(torch.load(tmp_path / "t.pt", weights_only=True), got)
    assert torch.equal(got["transposed"], state["transposed"])
    assert digest == hashlib.sha256((tmp_path / "s.pt").read_bytes()).hexdigest()
    assert (tmp_path / "s.pt").read_bytes()[:4] != ZIP_MAGIC
    assert read_state(tmp_path / "t.pt").keys() == state.keys()  # a torch.save file (older runs) still reads


def test_the_tensors_are_safetensors_readable(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    state = {"c_i": {"w": torch.randn(4, 3), "b": torch.arange(3)}, "n": 7}
    write_state(tmp_path / "s.pt", state)
    plain = safetensors_torch.load_file(tmp_path / "s.pt")
    assert torch.equal(plain["0"], state["c_i"]["w"]) and torch.equal(plain["1"], state["c_i"]["b"])


def test_a_state_with_other_values_is_written_by_torch_save(tmp_path):
    state = {"c_i": {"w": torch.ones(2)}, "labels": np.arange(3)}  # a NumPy array is no tensor
    write_state(tmp_path / "s.pt", state)
    assert (tmp_path / "s.pt").read_bytes()[:4] == ZIP_MAGIC
    with pytest.raises(Exception, match="weights_only|Unsupported|not allowed"):  # numpy arrays are refused on load
        read_state(tmp_path / "s.pt")
    write_state(tmp_path / "k.pt", {(1, 2): torch.ones(1)})  # a tuple key: torch.save, read back by torch.load
    assert list(read_state(tmp_path / "k.pt")) == [(1, 2)]


@pytest.mark.parametrize("damage", ["truncate", "header", "extra"])
def test_a_damaged_state_file_is_named(tmp_path, damage):
    path = tmp_path / "00001" / "r000002.pt"
    write_state(path, {"c_i": {"w": torch.randn(8, 8)}})
    data = path.read_bytes()
    path.write_bytes({"truncate": data[:-10], "header": data[:8] + b"[" + data[9:], "extra": data + b"\0"}[damage])
    with pytest.raises(StateFileError, match="r000002.pt: not a readable state file"):
        read_state(path)
    store = ClientStateStore(tmp_path)
    with pytest.raises(ClientStateError, match="r000002.pt: cannot load client state"):
        store.load(1, before_round=3)
