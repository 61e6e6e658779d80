"""Grouped copies: a set of tensors (a model's state, a client's vectors, a broadcast) copied, moved or
converted by one op per (device, dtype) instead of one per tensor, with exactly the per-tensor result;
and the state copies built on them (client states, checkpoint arrays, server-side float64 vectors)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedmedbench.fl.api.arrays import host_copies, host_tensors, snapshot
from fedmedbench.fl.methods import _sgd
from fedmedbench.fl.state.client_state import copy_state
from fedmedbench.fl.state.file_format import read_state, write_state

SPECIAL = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -3.5])


class Ops(TorchDispatchMode):
    """The non-view ATen ops run inside (each one kernel or more on a GPU)."""

    def __enter__(self):
        self.names: list[str] = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _separate() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.cat([torch.randn(5, generator=g), SPECIAL]).reshape(3, 4), "b": torch.randn(2, 1, 3, generator=g),
            "c": torch.tensor(2.5), "d": torch.randn(7, generator=g)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64) if t.dtype == torch.float64 else t.view(torch.int32) if t.dtype == torch.float32 else t


def _same_bits(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        assert torch.equal(_bits(got[k]), _bits(want[k])), k


def _no_shared_memory(copies: dict[str, torch.Tensor], sources: dict[str, torch.Tensor]) -> None:
    ptrs = {t.untyped_storage().data_ptr() for t in sources.values()}
    assert not ptrs & {t.untyped_storage().data_ptr() for t in copies.values()}


def test_separate_tensors_are_copied_by_one_concatenation():
    src = _separate()
    with Ops() as ops:
        got = snapshot(src)
    assert ops.names == ["aten.cat"]
    _same_bits(got, src)
    _no_shared_memory(got, src)


def test_views_of_one_buffer_are_copied_by_one_copy_and_converted_exactly():
    flat = torch.cat([t.reshape(-1) for t in _separate().values()])
    shapes = {k: t.shape for k, t in _separate().items()}
    tiled = dict(zip(shapes, (p.view(s) for p, s in zip(flat.split([s.numel() for s in shapes.values()]), shapes.values(),
                                                           strict=True)), strict=True))
    with Ops() as ops:
        got = snapshot(tiled)
    assert ops.names == ["aten._to_copy"]  # no concatenation: the views already tile one buffer
    _same_bits(got, tiled)
    _no_shared_memory(got, tiled)
    with Ops() as ops:
        wide = snapshot(tiled, dtype=torch.float64)
    assert ops.names == ["aten._to_copy"]
    _same_bits(wide, {k: t.to(torch.float64) for k, t in tiled.items()})
    assert torch.equal(wide["a"].flatten()[6].view(torch.int64), torch.tensor(-0.0, dtype=torch.float64).view(torch.int64))


@pytest.mark.parametrize("case", ["gap", "reversed", "overlap", "strided"])
def test_views_that_do_not_tile_in_order_are_concatenated(case):
    base = torch.arange(12, dtype=torch.float32)
    views = {"gap": {"x": base[:3], "y": base[4:6]}, "reversed": {"x": base[6:], "y": base[:6]},
             "overlap": {"x": base[:6], "y": base[3:9]}, "strided": {"x": base[::2], "y": base[1:2]}}[case]
    with Ops() as ops:
        got = snapshot(views)
    assert ops.names == ["aten.cat"]
    _same_bits(got, views)


def test_groups_keep_their_dtypes_and_order_and_move_to_the_device_asked():
    src = {"w": torch.ones(2), "n": torch.tensor([3, 4]), "v": torch.full((2,), -0.0), "m": torch.tensor([True, False])}
    with Ops() as ops:
        got = snapshot(src, "cpu")
    # float32 (two tensors: concatenated); int64 and bool (one tensor each: it tiles itself, one copy)
    assert sorted(ops.names) == ["aten._to_copy", "aten._to_copy", "aten.cat"]
    _same_bits(got, src)
    assert list(got) == ["w", "n", "v", "m"]
    with Ops() as ops:
        empty = snapshot({})
    assert empty == {} and ops.names == []


def test_copy_state_copies_plain_tensors_per_dtype_and_keeps_the_rest():
    state = {"c_i": _separate(), "steps": torch.arange(3), "p": torch.nn.Parameter(torch.ones(2)),
             "g": torch.zeros(2, requires_grad=True), "nested": [torch.ones(1), 3, (1.5, "x")], "s": "name"}
    with Ops() as ops:
        copied = copy_state(state)
    # the plain tensors, one op per dtype (float32: concatenated; int64: one tensor); the Parameter and the
    # tensor with a gradient one copy each, as before
    assert sorted(ops.names) == ["aten._to_copy"] * 3 + ["aten.cat"]
    _same_bits(copied["c_i"], state["c_i"])
    assert isinstance(copied["p"], torch.nn.Parameter) and copied["p"].requires_grad
    assert copied["g"].requires_grad and not copied["c_i"]["a"].requires_grad
    assert copied["nested"][1:] == [3, (1.5, "x")] and copied["s"] == "name"
    copied["c_i"]["a"].add_(1.0)
    assert torch.equal(_bits(state["c_i"]["a"]), _bits(_separate()["a"]))  # the source is not touched
    _same_bits(copied["c_i"], {**_separate(), "a": copied["c_i"]["a"]})  # nor are the other copies


def test_copy_state_and_state_file_round_trips_are_bit_identical(tmp_path):
    state = {"c_i": _separate(), "round": 4, "k": [torch.arange(2), 0.5]}
    copied = copy_state(state)
    write_state(tmp_path / "a.pt", copied)  # the held copy (views of one buffer) ...
    write_state(tmp_path / "b.pt", state)  # ... and the state itself give the same file
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    back = read_state(tmp_path / "a.pt")
    with Ops() as ops:
        again = copy_state(back)  # a state read back tiles its file's buffer: one copy per dtype
    assert sorted(ops.names) == ["aten._to_copy", "aten._to_copy"]
    _same_bits(again["c_i"], state["c_i"])


def test_stored_client_vectors_move_by_one_copy(tmp_path):
    like = {k: torch.zeros_like(v) for k, v in _separate().items()}
    write_state(tmp_path / "s.pt", {"c_i": _separate()})
    stored = read_state(tmp_path / "s.pt")
    with Ops() as ops:
        got = _sgd.state_tensors(stored, "c_i", like)
    assert ops.names == ["aten._to_copy"]
    _same_bits(got, _separate())
    first = _sgd.state_tensors({}, "c_i", like)  # no state yet: zeros
    assert all(torch.equal(first[k], like[k]) for k in like)


def test_server_float64_vectors_and_host_copies():
    src = _separate()
    with Ops() as ops:
        wide = _sgd.vectors64(src, ["a", "d"])
    assert ops.names == ["aten.cat", "aten._to_copy"]
    _same_bits(wide, {k: src[k].to(torch.float64) for k in ("a", "d")})
    host = _sgd.vectors64({"a": src["a"].numpy()}, ["a"])
    _same_bits(host, {"a": src["a"].to(torch.float64)})
    mixed = {"w": src["a"], "alpha": torch.tensor(0.25, dtype=torch.float64)}
    got = host_tensors(mixed)
    _same_bits(got, host_copies(mixed))
    _no_shared_memory({"w": got["w"]}, {"w": src["a"]})
    narrowed = _sgd.cast_like({k: v.double() for k, v in src.items()}, src, torch.float32)
    _same_bits(narrowed, src)


def test_division_off_the_cpu_divides_by_a_0_dim_tensor_never_by_a_number(monkeypatch):
    """A number divisor on a GPU is applied as a reciprocal multiplication (one bit less exact than the CPU's
    quotient); off the CPU, ``div`` hands every division a 0-dim divisor tensor of the operand's dtype and device."""
    seen = []
    real = torch._foreach_div

    def spy(tensors, other):
        seen.append(other)
        return real(tensors, other)

    monkeypatch.setattr(torch, "_foreach_div", spy)
    same = {"w": torch.ones(3, device="meta"), "b": torch.ones(2, device="meta")}
    mixed = {"w": torch.ones(3, device="meta"), "h": torch.ones(2, dtype=torch.float64, device="meta")}
    out = _sgd.div(same, 3)
    assert len(seen) == 1 and seen[0].shape == () and seen[0].device.type == "meta" and seen[0].dtype == torch.float32
    assert {k: v.dtype for k, v in _sgd.div(mixed, torch.tensor(2.0)).items()} == {"w": torch.float32, "h": torch.float64}
    assert out["w"].device.type == "meta" and len(seen) == 1  # mixed dtypes: per-tensor divisions by 0-dim tensors
    cpu = _sgd.div({"w": torch.full((3,), 1.0)}, 3)  # the CPU divides by the number as before
    assert isinstance(seen[-1], int) and torch.equal(cpu["w"], torch.full((3,), 1.0) / 3)
