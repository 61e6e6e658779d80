"""Several runs in one process, side by side: each round, their clients trained in one batched call.

A job of the earlystop grid trains its round's clients together (``train.batch_clients``), yet on a GPU it
still leaves the device waiting on the host part of the round (launches, aggregation, evaluation). Packing
jobs as processes shares the device by turns. Here N runs of one network and train block (the seeds of one
method, say) go round by round side by side in one process, and every round their sampled clients, N x K
of them, are stacked into one :func:`~fedmedbench.fl.methods._together.train_together` call: a step's
kernels are N times larger and launched once.

Each run is a thread running :func:`fedmedbench.fl.engine.flower.run` as it would alone, with its own outputs,
checkpoints and resumption. The threads take turns on one baton: one runs host code at a time and hands the
baton on only while it waits for the shared call, so a run's random draws (its global seeding and model
building among them) happen in its own order, undisturbed by the others; a run's place in the process-wide
generators (Python's, NumPy's, torch's) is put back when it takes the baton again, so a run that draws from them
mid-run draws as it would alone. The shared call is made by the
run that hands in last. What a run gets back equals what it would train alone with ``batch_clients`` to
float32 rounding (the stacked convolutions sum in another order; ``tests/test_runs_together.py``). Their
global models' predictions of a shared evaluation set (the same images) are made the same way, in one batched
pass. A run resumed a round ahead of the others (its checkpoint written before a kill, theirs not) waits for
them to reach its round. Runs whose rounds cannot share a call (another train block or network, a method's
perturbations that cannot mix) are trained in separate calls at the same point; a run that trains its clients
one by one withdraws. A client's non-finite loss fails its own run only, as alone; any other error in a shared
call fails every run of that call, each saying so.
"""

from __future__ import annotations

import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np

    from fedmedbench.fl.api.method import Arrays, ClientContext
    from fedmedbench.fl.engine import federation as fed
    from fedmedbench.fl.spec import RunSpec


@dataclass
class _Entry:
    """What one run hands in: its round's clients to train (``kind`` train: contexts and step hooks) or a model's
    predictions to make (predict: model, images, labels, batch size, device); ``key``: what entries made in one
    call share (None: only present). Once the call is done, its result or error."""

    name: str
    thread: int
    kind: str
    key: tuple | None
    payload: tuple
    rnd: int | None = None  # a round's clients: its round
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    partners: list[str] = field(default_factory=list)


class RoundPool:
    """The meeting point of ``members`` runs: each run still going hands in its next piece of work (a round's
    clients: :meth:`train`; a model's predictions: :meth:`predict`), and the last to do so makes them all, those
    that share a key in one call."""

    def __init__(self, members: int) -> None:
        self._cond = threading.Condition()
        self._baton = threading.Lock()  # held by the one run executing host code
        self._members = members
        self._entries: list[_Entry] = []
        self._names: dict[int, str] = {}  # thread -> its run's name, while it is a member
        self._rounds: dict[int, int] = {}  # thread -> the round of the clients it last handed in

    @contextmanager
    def member(self, name: str) -> Iterator[None]:
        """A run's whole life in the pool (its thread's): the baton taken first, left behind at the end; the
        thread's predictions go through the pool meanwhile."""
        from fedmedbench.fl import training

        self._baton.acquire()
        with self._cond:
            self._names[threading.get_ident()] = name
        training.shared_predictions.pool = self
        try:
            yield
        finally:
            self.withdraw()  # its predictions alone from here on too
            self._baton.release()

    def withdraw(self) -> None:
        """This run hands in no more work (it ended, failed, or trains its clients one by one): from here on it
        predicts alone too."""
        from fedmedbench.fl import training

        training.shared_predictions.pool = None
        with self._cond:
            if self._names.pop(threading.get_ident(), None) is None:
                return
            self._members -= 1
            if self._entries and len(self._entries) == self._members:
                self._run_all()

    def train(self, ctxs: list[ClientContext], hooks: list[Any] | None) -> list[tuple[Arrays, dict[str, float]]]:
        """This run's round (``Method.fit_together``'s trainer): its clients trained in one call with the other
        runs' rounds; without ``hooks`` it only marks this run as present at the round (its clients train one
        by one)."""
        from fedmedbench.fl.methods import _together

        key = None
        if ctxs and hooks is not None:  # the stacked step reads untrained parameters off the first run's model
            frozen = tuple(fingerprint(p) for p in ctxs[0].model.parameters() if not p.requires_grad)
            key = (*_together.merge_key(ctxs[0]), frozen)
        rnd = ctxs[0].rnd if ctxs else None
        return self._hand_in("train", key, (list(ctxs), list(hooks or [])), rnd) or []

    def predict(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                device: torch.device) -> tuple[np.ndarray, np.ndarray]:
        """``training.predict_samples`` of this run's model, made in one batched pass with the other runs' models
        predicting the same images (the global test or validation set of their seeds)."""
        if threading.get_ident() not in self._names:  # withdrawn: nobody waits for it
            from fedmedbench.fl.training import predict_alone

            return predict_alone(model, x, y, batch_size, device)
        shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters())
        shareable = not any(True for _ in model.buffers())  # batch statistics: each model predicts alone
        key = (fingerprint(x), fingerprint(y), batch_size, str(device), type(model), shapes, _hooks(model),
               None if shareable else threading.get_ident())
        return self._hand_in("predict", key, (model, x, y, batch_size, device))

    def _hand_in(self, kind: str, key: tuple | None, payload: tuple, rnd: int | None = None) -> Any:
        me = threading.get_ident()
        entry = _Entry(self._names.get(me, "?"), me, kind, key, payload, rnd)
        waited = False
        with self._cond:
            if rnd is not None:
                self._rounds[me] = rnd
            self._entries.append(entry)
            if len(self._entries) == self._members:
                self._run_all()
            if not entry.done:  # the others' pieces to make first, or this round ahead of theirs (left unmade)
                state = _global_generators()  # another run's draws move them while this one waits
                self._baton.release()
                waited = True
                while not entry.done:
                    self._cond.wait()
        if waited:
            self._baton.acquire()
            _set_global_generators(state)
        if entry.error is not None:
            if entry.partners:
                what = "clients" if kind == "train" else "predictions"
                raise RuntimeError(f"the {what} of runs {', '.join(entry.partners)}, made in one call: "
                                   f"{type(entry.error).__name__}: {entry.error}") from entry.error
            raise entry.error
        return entry.result

    def _run_all(self) -> None:
        """Every handed-in piece made but a round ahead of another run's (the caller holds the condition and the
        baton); their waiters woken, whatever fails (an error is each unmade piece's to raise)."""
        now = [e for e in self._entries if not self._ahead(e)]
        # a round ahead (a run resumed from a later checkpoint) waits for the others to reach it
        self._entries = [e for e in self._entries if self._ahead(e)]
        try:
            for call in _calls(now):
                _call(call)
        except BaseException as exc:  # noqa: BLE001 - every piece still unmade fails with it, none waits on
            for e in now:
                if e.result is None and e.error is None:
                    e.error = exc
        finally:
            for e in now:
                e.done = True
            self._cond.notify_all()

    def _ahead(self, e: _Entry) -> bool:
        """Whether ``e`` is a round's clients ahead of a run still going, which last handed in an earlier round."""
        if e.key is None or e.kind != "train":
            return False
        return any(r < e.rnd for t, r in self._rounds.items() if t != e.thread and t in self._names)


def _calls(entries: list[_Entry]) -> list[list[_Entry]]:
    """The handed-in pieces grouped into calls: those of one kind and key together, but rounds whose clients'
    step hooks cannot share a batched step (e.g. perturbations that cannot mix), one call a run."""
    from fedmedbench.fl.methods import _together

    groups: dict[tuple, list[_Entry]] = {}
    for e in entries:
        if e.key is not None:
            groups.setdefault((e.kind, e.key), []).append(e)
    calls = []
    for (kind, _), group in groups.items():
        if kind == "train" and len(group) > 1 and _together.round_why_not([h for e in group for h in e.payload[1]]):
            calls.extend([e] for e in group)
        else:
            calls.append(group)
    return calls


def _hooks(model: torch.nn.Module) -> tuple:
    """The forward hooks of ``model``'s layers (``train.input_norm``'s among them): the batched pass runs the first
    model's, so models predict together only where theirs are the same functions."""
    return tuple((name, tuple(m._forward_pre_hooks.values()), tuple(m._forward_hooks.values()))
                 for name, m in model.named_modules() if m._forward_pre_hooks or m._forward_hooks)


def fingerprint(t: torch.Tensor) -> str:
    """A digest of a tensor's shape, type and values (computed once per tensor object and version: a tensor
    written in place, as a resident model's are each round, is read again): runs predicting on the same images,
    each loaded by its own job, share a call."""
    import hashlib

    version = None if t.is_inference() else t._version  # an inference tensor keeps no version counter
    known = _digests.get(id(t))
    if known is not None and known[0]() is t and known[1] == version:
        return known[2]
    host = t.detach().cpu().contiguous()
    h = hashlib.blake2b(f"{tuple(host.shape)}{host.dtype}".encode(), digest_size=16)
    h.update(host.reshape(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b"")  # 0-dim too
    key = id(t)
    _digests[key] = (weakref.ref(t, lambda _, key=key: _digests.pop(key, None)), version, h.hexdigest())
    return _digests[key][2]


#: id of a tensor -> (a weak reference to it, its version when read, its digest); an entry leaves with its tensor
_digests: dict[int, tuple[weakref.ref, int | None, str]] = {}


def _global_generators() -> tuple:
    """The states of the process-wide generators a run may draw from (Python's, NumPy's, torch's CPU and CUDA)."""
    import random

    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_global_generators(state: tuple) -> None:
    import random

    import numpy as np
    import torch

    py, numpy_state, cpu, cuda = state
    random.setstate(py)
    np.random.set_state(numpy_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _call(call: list[_Entry]) -> None:
    """One call for the entries of ``call`` (one kind, one key), its results split back per run."""
    from fedmedbench.fl.methods import _together
    from fedmedbench.fl.training import predict_alone

    try:
        if call[0].kind == "train":
            trained = _together.train_together([c for e in call for c in e.payload[0]],
                                               [h for e in call for h in e.payload[1]], each_own_error=True)
            start = 0
            for e in call:
                n = len(e.payload[0])
                mine, start = trained[start:start + n], start + n
                e.error = next((r for r in mine if isinstance(r, BaseException)), None)  # a loss not finite: its own
                e.result = None if e.error is not None else mine
        elif len(call) == 1:  # nothing to share: predicted as alone
            call[0].result = predict_alone(*call[0].payload)
        else:
            _, x, y, bs, device = call[0].payload
            for e, out in zip(call, _together.predict_together([e.payload[0] for e in call], x, y, bs, device),
                              strict=True):
                e.result = out
    except Exception as exc:  # noqa: BLE001 - handed to every run of the call, which raises it
        for e in call:
            e.error, e.partners = exc, [x.name for x in call] if len(call) > 1 else []


def run_together(specs: Sequence[RunSpec], log: Callable[[str], None] = print) -> list[fed.Federation]:
    """Run (or resume) ``specs`` to completion side by side in this process, each writing its own outputs as
    :func:`fedmedbench.fl.engine.flower.run` does; raises after all have ended if any failed, naming them."""
    from fedmedbench.fl.engine import flower as engine

    pool = RoundPool(len(specs))
    done: list[fed.Federation | None] = [None] * len(specs)
    errors: list[BaseException | None] = [None] * len(specs)

    def one(i: int) -> None:
        name = engine.job_name(specs[i])
        with pool.member(name):
            try:
                done[i] = engine.run(specs[i], _named(log, name), pool=pool)
            except BaseException as exc:  # noqa: BLE001 - reported below, once every run has ended
                errors[i] = exc

    # daemons: an interrupt of the main thread (Ctrl-C) ends the process as it ends a run alone, not after every run
    threads = [threading.Thread(target=one, args=(i,), name=f"run{i}", daemon=True) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(s, e) for s, e in zip(specs, errors, strict=True) if e is not None]
    for s, e in failed:  # each run's own error in the log: the one raised below carries only the first
        log(f"{engine.job_name(s)}: failed: {''.join(traceback.format_exception(e)).rstrip()}")
    if failed:
        names = ", ".join(engine.job_name(s) for s, _ in failed)
        raise RuntimeError(f"{len(failed)} of {len(specs)} runs failed ({names}): {failed[0][1]}") from failed[0][1]
    return [f for f in done if f is not None]


def _named(log: Callable[[str], None], name: str) -> Callable[[str], None]:
    """``log`` with each line naming its run (the runs of a job share one log), where the line does not already;
    its ``console`` (a job log's round lines to the console, which name their run) kept."""
    def named(line: str) -> None:
        log(line if line.startswith(name) else f"{name}: {line}")

    if hasattr(log, "console"):
        named.console = log.console
    return named
