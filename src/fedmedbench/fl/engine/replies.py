"""What the server accepts from a client before averaging it, and the global model it keeps.

A reply is checked against the server's own model: the arrays a method declares a client sends
(:meth:`~fedmedbench.fl.api.method.Method.reply_keys`) with the model's shapes and dtypes, finite values,
and ``num-examples`` equal to the client's training size as the server knows it (or, where it does
not, a whole number in ``1..MAX_EXAMPLES``). Without this a bias of the wrong shape broadcasts into
the average, a missing key or a transposed weight fails deep inside a method, and a made-up size
reweights everyone. After aggregation the new global model must hold every shared key with the model's
shape (a server step that transposes a weight is named with the round, not found later as a load error),
and a non-finite one stops the run, naming the round and the clients whose replies were non-finite,
before anything is checkpointed or saved.

Values are torch tensors, on any device (the engine turns Flower's arrays into tensors before the
check). ``train.on_nonfinite: continue`` (the early-stopping reference, which keeps
training through a NaN loss) turns the finiteness checks off; the shape, key and size checks stay.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch

#: the most training examples a client may report where the server does not know its size
MAX_EXAMPLES = 10**9


class ReplyError(ValueError):
    """A client's reply the server refuses (names the round, the client, the record and key)."""


class ServerStepError(ValueError):
    """The method's server step returned a global model the server refuses (names the method and the round)."""


class NonFiniteModelError(RuntimeError):
    """The aggregated global model holds NaN or inf (names the round and the clients to blame)."""


def layout(value: torch.Tensor) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of a tensor; dtype names as NumPy spells them (``float32``, ``int64``)."""
    return tuple(value.shape), str(value.dtype).removeprefix("torch.")


def all_finite(values: Mapping[str, torch.Tensor]) -> str | None:
    """The first key whose tensor holds NaN or inf (None when all are finite): reduced on their device, one
    host read for the lot; integer and boolean entries are finite by type."""
    tensors = {k: v for k, v in values.items() if v.is_floating_point() or v.is_complex()}
    if tensors and not bool(torch.stack([v.detach().isfinite().all().to(next(iter(tensors.values())).device)
                                         for v in tensors.values()]).all()):
        return next(k for k, v in tensors.items() if not bool(v.detach().isfinite().all()))
    return None


def model_layout(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each state entry of the server's model: what replies are compared with."""
    return {k: layout(v) for k, v in model.state_dict().items()}


def is_number(value: Any) -> bool:
    """A real number, not a bool (``True`` would count as one example)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def examples_value(reported: Any) -> Any:
    """``num-examples`` as received: an int where it is a whole number, anything else as it came, for
    :meth:`ReplyCheck.check_examples` to refuse naming the client (a list, which a metric record may hold,
    or text is not a number)."""
    if not is_number(reported):
        return reported
    if isinstance(reported, numbers.Integral):
        return int(reported)
    x = float(reported)
    return int(x) if x.is_integer() else x


class ReplyCheck:
    """The server's reference for one round's replies.

    ``records``: what a reply holds by record name (``arrays``, and each extra record), as the method
    declares it: the model keys its entries mirror, or None where they are not the model's (values
    checked for finiteness only). ``arrays`` must hold exactly its keys; an extra record may be absent.
    ``model``: (shape, dtype) by model key. ``sizes``: training examples by partition id, or None
    where the server does not know them. ``finite``: refuse NaN and inf.
    """

    def __init__(self, rnd: int, records: Mapping[str, list[str] | None],
                 model: Mapping[str, tuple[tuple[int, ...], str]], sizes: Mapping[int, int] | None,
                 finite: bool = True) -> None:
        self.rnd, self.records, self.model, self.sizes, self.finite = rnd, dict(records), dict(model), sizes, finite

    def refuse(self, pid: int, what: str) -> ReplyError:
        return ReplyError(f"round {self.rnd}: client {pid} sent a reply the server refuses: {what}")

    def check(self, pid: int, arrays: Mapping[str, Any], num_examples: Any,
              extras: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Raise :class:`ReplyError` naming the client, the record and key and what is wrong."""
        self.check_examples(pid, num_examples)
        self.check_record(pid, "arrays", arrays, required=True)
        for name, values in (extras or {}).items():
            if name not in self.records:
                raise self.refuse(pid, f"undeclared record '{name}'")
            self.check_record(pid, name, values, required=False)

    def check_examples(self, pid: int, n: Any) -> None:
        if not is_number(n):
            raise self.refuse(pid, f"num-examples = {n!r} is not a number")
        if not isinstance(n, numbers.Integral) and (not math.isfinite(float(n)) or not float(n).is_integer()):
            raise self.refuse(pid, f"num-examples = {n} is not a whole number")
        n = int(n)
        if self.sizes is not None and pid in self.sizes:
            if n != int(self.sizes[pid]):
                raise self.refuse(pid, f"num-examples = {n}, but the client trains on {self.sizes[pid]} examples")
        elif not 1 <= n <= MAX_EXAMPLES:
            raise self.refuse(pid, f"num-examples = {n} is outside 1..{MAX_EXAMPLES}")

    def check_record(self, pid: int, name: str, values: Mapping[str, Any], required: bool) -> None:
        keys = self.records.get(name)
        where = "model arrays" if name == "arrays" else f"record '{name}'"
        if keys is not None:
            missing = [k for k in keys if k not in values]
            if missing and (required or values):
                raise self.refuse(pid, f"{where} lack '{missing[0]}'" + (f" (and {len(missing) - 1} more)"
                                                                       if len(missing) > 1 else ""))
            unexpected = [k for k in values if k not in set(keys)]
            if unexpected:
                raise self.refuse(pid, f"{where} hold '{unexpected[0]}', which this method does not send")
            for k in keys if values else ():
                got, want = layout(values[k]), self.model.get(k)
                if want is None:
                    continue
                if got[0] != want[0]:
                    raise self.refuse(pid, f"{where} '{k}' has shape {got[0]}, the server's model {want[0]}")
                if got[1] != want[1]:
                    raise self.refuse(pid, f"{where} '{k}' has dtype {got[1]}, the server's model {want[1]}")
        if self.finite:
            bad = all_finite(values)
            if bad is not None:
                raise self.refuse(pid, f"{where} '{bad}' holds NaN or inf")


def nonfinite_clients(results: Mapping[int, Any]) -> list[int]:
    """Partition ids whose reply (model arrays or extra records) holds NaN or inf."""
    return sorted(pid for pid, r in results.items()
                  if all_finite(r.arrays) is not None or any(all_finite(v) is not None for v in r.extras.values()))


def check_global(rnd: int, arrays: Mapping[str, Any], results: Mapping[int, Any], method: str) -> None:
    """Stop the run if the aggregated model is not finite, naming the round and whom to blame."""
    bad = all_finite(arrays)
    if bad is None:
        return
    clients = nonfinite_clients(results)
    cause = (f"the replies of client(s) {clients} were non-finite" if clients else
             f"every client's reply was finite: method '{method}''s server step made it so")
    raise NonFiniteModelError(f"round {rnd}: the global model is not finite ('{bad}' holds NaN or inf); {cause}. "
                              "The run stops here; nothing of this round is saved")


def check_aggregated(rnd: int, arrays: Mapping[str, Any], model: Mapping[str, tuple[tuple[int, ...], str]],
                     keys: list[str], method: str) -> None:
    """Stop the run if the method's server step returned a model without a shared key or with a key of
    another shape than the server's model, naming the method, the round and the key."""
    step = f"round {rnd}: method '{method}''s server step (aggregate) returned"
    end = "The run stops here; nothing of this round is saved"
    missing = [k for k in keys if k not in arrays]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ServerStepError(f"{step} a model without '{missing[0]}'{more}. {end}")
    for k, value in arrays.items():
        want = model.get(k)
        got = tuple(getattr(value, "shape", ()))
        if want is not None and got != want[0]:
            raise ServerStepError(f"{step} '{k}' with shape {got}, the server's model has {want[0]}. {end}")
