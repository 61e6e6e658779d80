"""Which samples each client of a batched round (``train.batch_clients``) trains on at each step, and which of the
stepping clients share one batched forward and backward.

The clients are stacked longest first (most steps, then most samples), so that the clients still stepping at a step
are a prefix of the stack. A batched call needs one batch width, so a client of a smaller batch than its call's
is padded with zero-weight samples. One call a step pads every client to the step's largest batch: under quantity
skew (one client of 256-sample batches, nine of a few samples each) that computes two to three times the useful
samples. A step's clients are therefore cut into groups of adjacent clients, one call a group, each padded to its
group's largest batch: the fewest groups whose padding keeps the step within :data:`PADDING` times its useful
samples (:func:`groups_of`). A step whose one call is within it (equal clients, as under Dirichlet and
pathological splits) stays one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedmedbench.fl.training import batch_indices

#: at most this many samples computed per useful one at every step (padding included)
PADDING = 1.10


def groups_of(widths: Sequence[int], padding: float | None = None) -> list[tuple[int, int, int]]:
    """The fewest groups of adjacent clients (``(start, stop, width)``, in order, covering ``widths``) whose
    padding to each group's largest batch keeps the computed samples within ``padding`` (default :data:`PADDING`)
    times the useful ones; of as many groups, the least padding (a dynamic program over the cuts: a group of one
    pads nothing)."""
    padding = PADDING if padding is None else padding
    if not padding >= 1.0:
        raise ValueError(f"padding {padding}: a step computes at least its useful samples (give 1 or more)")
    w = np.asarray(widths, dtype=np.int64)
    n = len(w)
    if n == 0:
        return []
    budget = (padding - 1.0) * float(w.sum())
    if n * int(w.max()) - int(w.sum()) <= budget:
        return [(0, n, int(w.max()))]
    cum = np.concatenate([[0], np.cumsum(w)])
    cost = np.full((n + 1, n + 1), np.inf)  # cost[j, i]: the padding of one group of clients j .. i-1
    for j in range(n):
        top = np.maximum.accumulate(w[j:])
        sizes = np.arange(1, n - j + 1)
        cost[j, j + 1:] = sizes * top - (cum[j + 1:] - cum[j])
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    cuts = []  # per number of groups: each end's best start
    while not best[n] <= budget:  # n groups of one pad nothing: at most n rounds
        totals = best[:, None] + cost
        cuts.append(totals.argmin(axis=0))
        best = totals.min(axis=0)
    out, stop = [], n
    for back in reversed(cuts):
        start = int(back[stop])
        out.append((start, stop, int(w[start:stop].max())))
        stop = start
    return out[::-1]


class BatchPlan:
    """Which samples each client trains on at each batched step, drawn as the one-by-one loop draws them.

    ``order``: positions in the callers' list, longest first. ``rows[s][c]``: the c-th client's sample indices
    (into its own training data) at step s, or None once its steps are done. ``active[s]``: how many clients step
    (the first ones); ``groups[s]``: their groups, ``(start, stop, width)``. Steps: the most any client takes."""

    def __init__(self, rows: list[list[np.ndarray | None]], sizes: list[int], order: list[int],
                 padding: float | None = None) -> None:
        self.rows = rows
        self.sizes = sizes
        self.order = order
        self.steps = len(rows)
        self.active = [sum(r is not None for r in step) for step in rows]
        self.groups = [groups_of([len(r) for r in step[:n]], padding) for step, n in zip(rows, self.active, strict=True)]
        #: per step, where its samples start in the flat index (:meth:`tensors`) and how many it computes
        self.counts = [sum((stop - start) * width for start, stop, width in g) for g in self.groups]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(int).tolist()

    @classmethod
    def of(cls, ctxs: Sequence, batch_size: int, padding: float | None = None) -> BatchPlan:
        """The plan of the clients ``ctxs`` (each with its ``data.num_train``, ``steps`` and ``generator``)."""
        draws = [[idx.numpy() for idx in batch_indices(c.data.num_train, batch_size, c.steps, c.generator)]
                 for c in ctxs]
        return cls.of_draws(draws, [c.data.num_train for c in ctxs], padding)

    @classmethod
    def of_draws(cls, draws: Sequence[Sequence[np.ndarray]], sizes: Sequence[int],
                 padding: float | None = None) -> BatchPlan:
        """The plan of clients whose batches are ``draws`` (per client, per step) from data of ``sizes``."""
        # stable: equal ones keep their order
        order = sorted(range(len(draws)), key=lambda c: (-len(draws[c]), -int(sizes[c])))
        draws = [draws[c] for c in order]
        steps = max((len(d) for d in draws), default=0)
        rows = [[d[s] if s < len(d) else None for d in draws] for s in range(steps)]
        return cls(rows, [int(sizes[c]) for c in order], order, padding)

    @property
    def useful(self) -> int:
        """The samples the clients' steps train on."""
        return sum(len(r) for step in self.rows for r in step if r is not None)

    @property
    def computed(self) -> int:
        """The samples the batched calls compute, padding included."""
        return self.offsets[-1]

    @property
    def calls(self) -> int:
        """The batched forward and backward calls of the plan (its steps' groups)."""
        return sum(len(g) for g in self.groups)

    @staticmethod
    def pooled(ctxs: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        """The clients' training images and labels back to back, in the plan's order (``ctxs`` ordered as
        ``order``), where the first client's data are."""
        xs = [c.data.train_x for c in ctxs]
        ys = [c.data.train_y for c in ctxs]
        where = xs[0].device
        return torch.cat([x.to(where) for x in xs]), torch.cat([y.to(where) for y in ys])

    def tensors(self, data_device: torch.device, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Every step's indices into the pooled data and sample weights (1/b for a client's b samples, 0 for
        padding), flat: step s's are ``offsets[s]:offsets[s + 1]``, its groups one after another, each group
        (clients, width) in row-major order (:meth:`block`)."""
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        index = np.zeros(self.computed, dtype=np.int64)
        weight = np.zeros(self.computed, dtype=np.float32)
        for s, step in enumerate(self.rows):
            at = self.offsets[s]
            for start, stop, width in self.groups[s]:
                for c in range(start, stop):
                    rows = step[c]
                    index[at : at + width] = offsets[c]
                    index[at : at + len(rows)] = rows + offsets[c]
                    weight[at : at + len(rows)] = 1.0 / len(rows)
                    at += width
        return torch.from_numpy(index).to(data_device), torch.from_numpy(weight).to(device)

    def step(self, flat: torch.Tensor, s: int) -> torch.Tensor:
        """Step s's part of a tensor laid out as :meth:`tensors` (a view)."""
        return flat[self.offsets[s] : self.offsets[s + 1]]

    def block(self, step: torch.Tensor, s: int, g: int) -> torch.Tensor:
        """Group g of step s out of that step's part (:meth:`step`: indices, weights, or what they gathered, the
        first dimension flat), as (clients, width, ...) (a view)."""
        start, stop, width = self.groups[s][g]
        at = sum((b - a) * w for a, b, w in self.groups[s][:g])
        return step[at : at + (stop - start) * width].view(stop - start, width, *step.shape[1:])
