"""Several runs in one process, side by side: each round, their clients trained in one batched call.

A job of the earlystop grid trains its round's clients together (``train.batch_clients``), yet on a GPU it
still leaves the device waiting on the host part of the round (launches, aggregation, evaluation). Packing
jobs as processes shares the device by turns. Here N runs of one network and train block (the seeds of one
method, say) go round by round side by side in one process, and every round their sampled clients, N x K
of them, are stacked into one :func:`~fedmedbench.fl.methods._together.train_together` call: a step's
kernels are N times larger and launched once.

Each run is a thread running :func:`fedmedbench.fl.engine.run` as it would alone, with its own outputs,
checkpoints and resumption. The threads take turns on one baton: one runs host code at a time and hands the
baton on only while it waits for the shared call, so a run's random draws (its global seeding and model
building among them) happen in its own order, undisturbed by the others; a run's place in the process-wide
generators (Python's, NumPy's, torch's) is put back when it takes the baton again, so a run that draws from them
mid-run draws as it would alone. The shared call is made by the
run that hands in last. What a run gets back equals what it would train alone with ``batch_clients`` to
float32 rounding (the stacked convolutions sum in another order; ``tests/test_runs_together.py``). A run
resumed a round ahead of the others (its checkpoint written before a kill, theirs not) waits for them to
reach its round. Runs whose rounds cannot share a call (another train block or network, a method's
perturbations that cannot mix) are trained in separate calls at the same point; a run that trains its
clients one by one withdraws. A client's non-finite loss fails its own run only, as alone; any other error
in a shared call fails every run of that call, each saying so.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedmedbench.fl import federation as fed
    from fedmedbench.fl.api import Arrays, ClientContext
    from fedmedbench.fl.spec import RunSpec


@dataclass
class _Entry:
    """One run's round handed in: its clients, their step hooks and, once the call is done, the results."""

    name: str
    ctxs: list[ClientContext]
    hooks: list[Any]
    result: list[tuple[Arrays, dict[str, float]]] | None = None
    error: BaseException | None = None
    done: bool = False
    partners: list[str] = field(default_factory=list)


class RoundPool:
    """The meeting point of ``members`` runs: each round, every run still going hands in its clients
    (:meth:`train`), and the last to do so trains them all in one call."""

    def __init__(self, members: int) -> None:
        self._cond = threading.Condition()
        self._baton = threading.Lock()  # held by the one run executing host code
        self._members = members
        self._entries: list[_Entry] = []
        self._names: dict[int, str] = {}  # thread -> its run's name, while it is a member

    @contextmanager
    def member(self, name: str) -> Iterator[None]:
        """A run's whole life in the pool (its thread's): the baton taken first, left behind at the end."""
        self._baton.acquire()
        with self._cond:
            self._names[threading.get_ident()] = name
        try:
            yield
        finally:
            self.withdraw()
            self._baton.release()

    def withdraw(self) -> None:
        """This run hands in no more rounds (it ended, failed, or trains its clients one by one)."""
        with self._cond:
            if self._names.pop(threading.get_ident(), None) is None:
                return
            self._members -= 1
            if self._entries and len(self._entries) == self._members:
                self._train_all()

    def train(self, ctxs: list[ClientContext], hooks: list[Any]) -> list[tuple[Arrays, dict[str, float]]]:
        """This run's round (``Method.fit_together``'s trainer): its clients trained in one call with the other
        runs' rounds; an empty round only marks this run as present (its clients train one by one)."""
        entry = _Entry(self._names.get(threading.get_ident(), "?"), list(ctxs), list(hooks))
        waited = False
        with self._cond:
            self._entries.append(entry)
            if len(self._entries) == self._members:
                self._train_all()
            else:
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
                raise RuntimeError(f"the clients of runs {', '.join(entry.partners)}, trained in one call: "
                                   f"{type(entry.error).__name__}: {entry.error}") from entry.error
            raise entry.error
        return entry.result if entry.result is not None else []

    def _train_all(self) -> None:
        """Every handed-in round of the earliest round number trained (the caller holds the condition and the
        baton); their waiters woken, whatever fails (an error is each untrained round's to raise)."""
        first = min((e.ctxs[0].rnd for e in self._entries if e.ctxs), default=None)
        entries = [e for e in self._entries if not e.ctxs or e.ctxs[0].rnd == first]
        # a round ahead of the earliest (a run resumed from a later checkpoint) waits for the others to reach it
        self._entries = [e for e in self._entries if e.ctxs and e.ctxs[0].rnd != first]
        try:
            for call in _calls(entries):
                _train_call(call)
        except BaseException as exc:  # noqa: BLE001 - every round still untrained fails with it, none waits on
            for e in entries:
                if e.ctxs and e.result is None and e.error is None:
                    e.error = exc
        finally:
            for e in entries:
                e.done = True
            self._cond.notify_all()


def _calls(entries: list[_Entry]) -> list[list[_Entry]]:
    """The handed-in rounds grouped into calls: rounds that can share one ``train_together`` call together."""
    from fedmedbench.fl.methods import _together

    groups: dict[tuple, list[_Entry]] = {}
    for e in entries:
        if e.ctxs:
            groups.setdefault(_together.merge_key(e.ctxs[0]), []).append(e)
    calls = []
    for group in groups.values():
        if len(group) > 1 and _together.round_why_not([h for e in group for h in e.hooks]):
            calls.extend([e] for e in group)  # e.g. perturbations that cannot mix: one call a run
        else:
            calls.append(group)
    return calls


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


def _train_call(call: list[_Entry]) -> None:
    """One ``train_together`` call for the rounds of ``call``, its results split back per run."""
    from fedmedbench.fl.methods import _together

    try:
        trained = _together.train_together([c for e in call for c in e.ctxs], [h for e in call for h in e.hooks],
                                           each_own_error=True)
    except Exception as exc:  # noqa: BLE001 - handed to every run of the call, which raises it
        for e in call:
            e.error, e.partners = exc, [x.name for x in call] if len(call) > 1 else []
        return
    start = 0
    for e in call:
        mine, start = trained[start:start + len(e.ctxs)], start + len(e.ctxs)
        e.error = next((r for r in mine if isinstance(r, BaseException)), None)  # a loss not finite: its own
        e.result = None if e.error is not None else mine


def run_together(specs: Sequence[RunSpec], log: Callable[[str], None] = print) -> list[fed.Federation]:
    """Run (or resume) ``specs`` to completion side by side in this process, each writing its own outputs as
    :func:`fedmedbench.fl.engine.run` does; raises after all have ended if any failed, naming them."""
    from fedmedbench.fl import engine

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
