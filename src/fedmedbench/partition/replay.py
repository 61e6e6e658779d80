"""The early-stopping authors' random draws, call for call (github yjlee22/earlystop, commit 52e7d7f).

Their code seeds NumPy's legacy global generator (``np.random.seed(seed)``, ``train.py:54``); the run
that builds a partition reseeds it with the same seed and draws the permutation and the partition in
``dataset.py``'s order (``dataset.py:72-181``); the server then draws each round's clients with
``np.random.choice(range(N), M, replace=False)`` (``server/server.py:83-88,334``). Nothing else draws
from that generator (client training and evaluation use torch's). Replaying those calls on the
official label order gives, for a seed, the same clients holding the same samples (in the same
positions) and the same client set in every round.

``random_draws`` (study key, names in :data:`DRAWS`):

* ``project`` — the project's own generators (``partition/schemes.py`` schemes, ``Federation.sample``).
* ``reference`` — partitions as ``dataset.py``; each round's clients drawn from a freshly seeded
  stream, as in every run that finds the partition already cached (``dataset.py:189-196`` draws
  nothing): all runs of a setting and seed but the first.
* ``reference_cache_build`` — the same partitions; the clients drawn from the stream left after the
  partition draws, as in the one run that built the cache. That run also reads its three splits through
  ``next(iter(DataLoader(...)))`` (``dataset.py:54-66``, shuffle off) before it builds its model (``train.py:69-72``):
  each iterator draws one int64 base seed from torch's global generator, so its start model is the one after
  three such draws (:func:`cache_build_torch_draws`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: readings of ``random_draws`` (default first)
DRAWS = ("project", "reference", "reference_cache_build")
#: int64 draws from torch's global generator between the seed and the model in the cache-building run:
#: one ``_BaseDataLoaderIter`` base seed per ``next(iter(loader))`` of dataset.py:64-66 (SequentialSampler draws none)
CACHE_BUILD_TORCH_DRAWS = 3
#: partition schemes whose reference draws are replayed, and the ``dataset.py`` rule of each
REPLAYED_SCHEMES = {"iid": "iid", "fls": "Dirichlet", "fls_pathological": "Pathological", "fls_quantity": "Quantity"}
#: inner redraws of one sample's class after which the reference's loop is taken not to end
_MAX_REDRAWS = 100_000


class ReplayError(ValueError):
    """A partition the reference's draws cannot give (the message names the parameter)."""


def check_setting(scheme: str, params: dict[str, Any]) -> str | None:
    """Why a setting cannot use the reference's draws (None when it can)."""
    if scheme not in REPLAYED_SCHEMES:
        return (f"scheme '{scheme}' has no reference draws; the authors' code partitions with "
                f"{', '.join(sorted(REPLAYED_SCHEMES))} only")
    if scheme == "fls_quantity" and params.get("min_size", 1) != 1:
        return f"fls_quantity: the reference gives every client 1 sample first (dataset.py:163), not min_size={params['min_size']}"
    return None


@dataclass
class Replayed:
    """Training indices per client (into the train split, in the reference's positions) and the
    legacy generator's state after the partition draws (JSON form)."""

    train: list[np.ndarray]
    state_after: dict[str, Any]


def client_sizes(n: int, num_clients: int) -> np.ndarray:
    """``dataset.py:84-92``: floor(n / N) each; the shortfall goes to the first client that can take it."""
    sizes = np.ones(num_clients, dtype=np.int64) * (n // num_clients)
    diff = int(sizes.sum()) - n
    if diff != 0:
        for i in range(num_clients):
            if sizes[i] > diff:
                sizes[i] -= diff
                break
    return sizes


def replay_partition(scheme: str, labels: np.ndarray, num_clients: int, seed: int, params: dict[str, Any],
                     n_classes: int) -> Replayed:
    """``dataset.py``'s partition of ``labels`` (official order) for ``seed``: the same calls, in order.

    ``n_classes`` is the dataset's class count (the reference's ``len(INFO[flag]['label'])``, ``dataset.py:62``),
    which sizes the Dirichlet priors even where a class has no training sample."""
    reason = check_setting(scheme, params)
    if reason:
        raise ReplayError(reason)
    n = len(labels)
    if not 1 <= num_clients <= n:
        raise ReplayError(f"num_clients={num_clients} must be between 1 and the {n} training samples")
    rule = REPLAYED_SCHEMES[scheme]
    rs = np.random.RandomState(seed)  # the state np.random.seed(seed) gives the global generator
    perm = rs.permutation(n)  # dataset.py:73
    if rule == "Quantity":
        train = _quantity(rs, perm, num_clients, float(params["alpha"]))
    elif rule == "iid":
        train = _slices(perm, client_sizes(n, num_clients))
    else:
        if rule == "Dirichlet":
            if float(params["alpha"]) <= 0:
                raise ReplayError(f"alpha must be > 0, got {params['alpha']}")
            cum = np.cumsum(rs.dirichlet(alpha=[float(params["alpha"])] * n_classes, size=num_clients), axis=1)
        else:
            cum = _pathological_cumulative(rs, num_clients, n_classes, int(params["classes_per_client"]))
        train = _fill(rs, perm, np.asarray(labels)[perm], client_sizes(n, num_clients), cum)
    return Replayed(train, state_to_json(rs.get_state()))


def _pathological_cumulative(rs: np.random.RandomState, num_clients: int, n_classes: int, c: int) -> np.ndarray:
    """``dataset.py:99-107``: c ones per row, each row shuffled; the cumulative prior, 0 where a row has 0."""
    if not 1 <= c <= n_classes:
        raise ReplayError(f"classes_per_client must be in 1..{n_classes}, got {c}")
    a = np.ones([num_clients, n_classes])
    a[:, c:] = 0
    for row in a:
        rs.shuffle(row)
    return np.where(a != 0, np.cumsum(a, axis=1) / c, 0.0)


def _fill(rs: np.random.RandomState, perm: np.ndarray, permuted_labels: np.ndarray, sizes: np.ndarray,
          cum: np.ndarray) -> list[np.ndarray]:
    """``dataset.py:109-133``: a random client (full ones redrawn), a class from its prior; the class's
    next sample from the end of its pool; an exhausted class is refilled and the class drawn again.
    A client's array fills from its end."""
    n_classes = cum.shape[1]
    pools = [np.flatnonzero(permuted_labels == k) for k in range(n_classes)]
    amount = [len(p) for p in pools]
    left = sizes.copy()
    out = [np.zeros(int(s), dtype=np.int64) for s in sizes]
    num_clients = len(sizes)
    while left.sum() != 0:
        client = rs.randint(num_clients)
        if left[client] <= 0:
            continue
        left[client] -= 1
        for _ in range(_MAX_REDRAWS):
            k = int(np.argmax(rs.uniform() <= cum[client]))
            if amount[k] <= 0:
                amount[k] = len(pools[k])
                continue
            amount[k] -= 1
            out[client][left[client]] = perm[pools[k][amount[k]]]
            break
        else:
            raise ReplayError(f"client {client}: its classes have no training samples (the reference's loop never ends)")
    return out


def _quantity(rs: np.random.RandomState, perm: np.ndarray, num_clients: int, alpha: float) -> list[np.ndarray]:
    """``dataset.py:153-179``: 1 + Multinomial(n - N, Dir(alpha)) samples each, consecutive runs of the permutation."""
    if alpha <= 0:
        raise ReplayError(f"alpha must be > 0, got {alpha}")
    props = rs.dirichlet(alpha=[alpha] * num_clients)
    sizes = np.ones(num_clients, dtype=np.int64) + rs.multinomial(len(perm) - num_clients, props)
    return _slices(perm, sizes)


def _slices(perm: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    cuts = np.concatenate(([0], np.cumsum(sizes)))
    return [perm[cuts[i]:cuts[i + 1]].astype(np.int64) for i in range(len(sizes))]


def state_to_json(state: tuple) -> dict[str, Any]:
    """A legacy generator state (``RandomState.get_state()``) as JSON."""
    name, keys, pos, has_gauss, cached = state
    return {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos), "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached)}


def state_from_json(doc: dict[str, Any]) -> tuple:
    return (doc["name"], np.asarray(doc["keys"], dtype=np.uint32), int(doc["pos"]), int(doc["has_gauss"]),
            float(doc["cached_gaussian"]))


class ClientSequence:
    """Each round's clients as ``server/server.py:83-88`` draws them: one ``choice`` per round, in order.

    Rounds are 1-based (round r is the reference's t = r - 1). The draws are kept, so asking for the
    rounds in any order (a resumed run starts late) gives the same sets.
    """

    def __init__(self, seed: int, num_clients: int, per_round: int, state: dict[str, Any] | None = None) -> None:
        self._rs = np.random.RandomState(seed)
        if state is not None:
            self._rs.set_state(state_from_json(state))
        self.num_clients, self.per_round = num_clients, per_round
        self._drawn: list[list[int]] = []

    def clients(self, rnd: int) -> list[int]:
        """Partition ids of round ``rnd`` in the order drawn."""
        if rnd < 1:
            raise ValueError(f"rounds are 1-based, got {rnd}")
        while len(self._drawn) < rnd:
            ids = self._rs.choice(range(self.num_clients), self.per_round, replace=False)
            self._drawn.append([int(i) for i in ids])
        return list(self._drawn[rnd - 1])


def client_sequence(draws: str, seed: int, num_clients: int, per_round: int,
                    partition: dict[str, Any] | None = None) -> ClientSequence | None:
    """The sequence a run of ``draws`` samples (None for ``project``); ``reference_cache_build`` starts
    from the state its partition document recorded after the partition draws."""
    if draws not in DRAWS:
        raise ValueError(f"random_draws = {draws!r}; choose from {', '.join(DRAWS)}")
    if draws == "project":
        return None
    state = None
    if draws == "reference_cache_build":
        state = (partition or {}).get("rng_after_partition")
        if state is None:
            raise ValueError("random_draws = reference_cache_build needs a partition built with the reference's "
                             "draws (its document has no rng_after_partition); rebuild the partition")
    return ClientSequence(seed, num_clients, per_round, state)


def cache_build_torch_draws(draws: str) -> None:
    """Under ``reference_cache_build``, the cache-building run's torch draws before its model
    (:data:`CACHE_BUILD_TORCH_DRAWS` int64 base seeds, as three DataLoader iterators take them); nothing otherwise."""
    if draws != "reference_cache_build":
        return
    import torch

    for _ in range(CACHE_BUILD_TORCH_DRAWS):
        torch.empty((), dtype=torch.int64).random_()
