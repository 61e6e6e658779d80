"""Weight perturbations of the SAM family, declared: each is called for one client's step
(``StepHooks.perturb``: (model, xb, yb) -> e) and has a batched form for a round's clients trained
together (``train.batch_clients``, :mod:`fedmedbench.fl.methods._together`), which computes the same e
for every client at once from their stacked weights.

A batched form works on lists of stacked tensors (K clients, ...) in parameter order, with the helpers of
:class:`Stack` (per-client norms, per-client scalars broadcast, per-client vectors stacked). The clients
stepping at a step are the stack's first n (``_together``'s plan puts the longest first): a step passes
their rows, and a batched form reads and moves the first n rows of its own state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from fedmedbench.fl.methods._step import Tensors, gradient_at, sam_perturbation


class Stack:
    """The round's clients' tensors stacked (K, ...) in parameter order, and per-client arithmetic on them."""

    def __init__(self, params: Tensors, k: int, device: torch.device) -> None:
        self.params, self.k, self.device = params, k, device
        self.per_rank: dict[int, list[int]] = {}
        for i, p in enumerate(params.values()):
            self.per_rank.setdefault(p.dim() + 1, []).append(i)

    def stacked(self, per_client: Sequence[Tensors | None]) -> list[torch.Tensor] | None:
        """Each client's vector over the parameters (a gradient correction d, a perturbation e) stacked, zeros
        where a client has none; None where no client has one."""
        if all(not v for v in per_client):
            return None
        out = []
        for n, p in self.params.items():
            # a per-tensor scalar (FedLESAM's reference form) is the same number on every entry of its tensor
            rows = [v[n].to(self.device).broadcast_to(p.shape) if v and n in v else torch.zeros_like(p)
                    for v in per_client]
            out.append(torch.stack(rows).to(p.dtype))
        return out

    def by_rank(self, values: torch.Tensor) -> list[torch.Tensor]:
        """One (n,) vector as (n, 1, ..., 1) views broadcasting against each stacked tensor's first n rows."""
        out: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        for rank, idx in self.per_rank.items():
            view = values.view(len(values), *([1] * (rank - 1)))
            for i in idx:
                out[i] = view
        return out

    def norms(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Each client's norm over all of its tensors, (n,) for tensors of n rows."""
        return torch.linalg.vector_norm(torch.cat([t.reshape(len(t), -1) for t in tensors], dim=1), dim=1)

    def scaled(self, tensors: list[torch.Tensor], per_client: torch.Tensor) -> list[torch.Tensor]:
        """Each client's tensors times its number of ``per_client`` (n,)."""
        return torch._foreach_mul(tensors, self.by_rank(per_client))

    def sam(self, tensors: list[torch.Tensor], rho: float | torch.Tensor) -> list[torch.Tensor]:
        """Each client's rho * g/||g|| (``sam_perturbation`` per client; ``rho``: one number or one per client)."""
        return self.scaled(tensors, rho / (self.norms(tensors) + 1e-7))

    def rows(self, tensors: list[torch.Tensor]) -> list[Tensors]:
        """Per client, its slice of each stacked tensor (views), by parameter name."""
        columns = [t.unbind(0) for t in tensors]
        return [{n: col[c] for n, col in zip(self.params, columns, strict=True)} for c in range(self.k)]

    def first(self, tensors: list[torch.Tensor], n: int) -> list[torch.Tensor]:
        """The first n clients' rows of stacked tensors (views; the tensors themselves when n is all)."""
        return tensors if n == self.k else [t[:n] for t in tensors]


class Perturbation:
    """A ``StepHooks.perturb`` that clients trained together can share: ``__call__`` for one client's
    step, :meth:`batched` for the round's clients (every client's perturbation of one class).

    A batched form may read a setting off the first client (``shared``) or need a perturbation on every
    client of the round (``every_client``): :meth:`batch_why_not` says when a round's clients break that, so
    the round is trained one by one instead of with another client's settings."""

    #: the settings (attribute names) the batched form takes from the first client: equal on every client
    shared: ClassVar[tuple[str, ...]] = ()
    #: whether the batched form needs every client of the round to have a perturbation of this class
    every_client: ClassVar[bool] = False

    def __call__(self, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> Tensors | None:
        raise NotImplementedError

    @classmethod
    def batch_why_not(cls, perturbs: Sequence[Perturbation | None]) -> str | None:
        """Why :meth:`batched` cannot take these clients' perturbations (None: it can): another class, a
        client without one where the form needs every client's, or unequal ``shared`` settings."""
        present = [p for p in perturbs if p is not None]
        if any(type(p) is not cls for p in present):
            return "clients of different perturbations"
        if cls.every_client and len(present) < len(perturbs):
            return f"a client without a {cls.__name__} perturbation (its batched form needs every client's)"
        for name in cls.shared:
            if any(getattr(p, name) != getattr(present[0], name) for p in present[1:]):
                return f"clients of different {cls.__name__} {name}"
        return None

    @classmethod
    def batched(cls, perturbs: Sequence[Perturbation | None], stack: Stack) -> BatchedPerturbation:
        """The batched form of the clients' perturbations (None: that client has none this round)."""
        raise NotImplementedError


def batch_why_not(perturbs: Sequence[Perturbation | None]) -> str | None:
    """Why a round's clients, with these perturbations (None: a client has none), cannot share one batched
    form (None: they can, or none has one): the first one's class decides (:meth:`Perturbation.batch_why_not`)."""
    kind = next((type(p) for p in perturbs if p is not None), None)
    return None if kind is None else kind.batch_why_not(perturbs)


class BatchedPerturbation:
    """One step's perturbation of the stepping clients, (n, ...) per parameter tensor."""

    #: whether :meth:`e` needs the gradient at the current weights on the step's batches
    needs_gradient = False

    def e(self, weights: list[torch.Tensor], grads: list[torch.Tensor] | None, n: int) -> list[torch.Tensor] | None:
        """This step's perturbations of the first ``n`` clients, whose weights (and gradients) these are (None:
        none this step); the other clients' state must not move."""
        raise NotImplementedError

    def after_step(self, n: int) -> None:
        """Called after every optimizer step of the first ``n`` clients (a method's own ``StepHooks.after_step``,
        batched)."""

    def finish(self) -> None:
        """Each client's perturbation state written back to it once the steps are done."""


@dataclass(frozen=True)
class SamAscent(Perturbation):
    """SAM's ascent e = rho * g/||g|| from the gradient at the current weights on the step's batch (FedSAM,
    FedSpeed, FedGAMMA)."""

    rho: float

    def __call__(self, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> Tensors:
        return sam_perturbation(gradient_at(model, xb, yb), self.rho)

    @classmethod
    def batched(cls, perturbs: Sequence[Perturbation | None], stack: Stack) -> BatchedPerturbation:
        rho = [p.rho if isinstance(p, SamAscent) else 0.0 for p in perturbs]  # rho 0: e = 0, no ascent
        return _BatchedAscent(torch.tensor(rho, dtype=torch.float32, device=stack.device), stack)


class _BatchedAscent(BatchedPerturbation):
    needs_gradient = True

    def __init__(self, rho: torch.Tensor, stack: Stack) -> None:
        self.rho, self.stack = rho, stack

    def e(self, weights, grads, n):
        return self.stack.sam(grads, self.rho[:n])


@dataclass(frozen=True)
class FixedPerturbation(Perturbation):
    """The same e at every step of the round (FedLESAM's estimate)."""

    e_round: Tensors

    def __call__(self, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> Tensors:
        return self.e_round

    @classmethod
    def batched(cls, perturbs: Sequence[Perturbation | None], stack: Stack) -> BatchedPerturbation:
        return _BatchedFixed(stack.stacked([p.e_round if isinstance(p, FixedPerturbation) else None for p in perturbs]),
                             stack)


class _BatchedFixed(BatchedPerturbation):
    def __init__(self, e: list[torch.Tensor] | None, stack: Stack) -> None:
        self._e, self.stack = e, stack

    def e(self, weights, grads, n):
        return None if self._e is None else self.stack.first(self._e, n)
