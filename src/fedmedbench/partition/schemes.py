"""Client partitions of a MedMNIST-format dataset: every scheme, one function each.

A scheme assigns *training* indices to clients. The dispatcher :func:`build_partition`
then gives each client validation and test indices drawn from the official val/test
splits in proportion to the client's training label counts (so a client's local
val/test data follow its own label distribution; splits stay disjoint and cover the
val/test sets), and writes one JSON document (see :func:`build_partition`).

Schemes and their sources:

* ``iid``, ``dirichlet`` (NIID-Bench label skew with its min-size resampling and
  self-balancing) and ``pathological`` (NIID-Bench ``#C=k``: client i gets class
  i mod K plus k-1 random others; each class split evenly among its holders) use
  ``flwr_datasets`` partitioners, which implement exactly these algorithms.
* ``quantity`` (NIID-Bench quantity skew: client sizes from Dir(alpha), resampled
  until every client has ``min_size`` samples) is written here: flwr-datasets has no
  equivalent.
* ``fls``, ``fls_pathological``, ``fls_quantity``: the sampler of the early-stopping
  paper's public code (the FL-Simulator family). Every client holds floor(n / N)
  samples and client 0 also the remainder; client n has a class prior (Dir(alpha) for
  ``fls``, uniform over ``k`` random classes for ``fls_pathological``); samples are
  drawn one at a time for a random non-full client, the class from its prior, the next
  unused sample of that class; an exhausted class is *refilled* (its pool restarts),
  so samples can repeat across clients under strong skew. ``fls_quantity`` gives each
  client ``min_size`` (1) samples plus a multinomial share of the rest with
  probabilities from Dir(alpha), every sample used once. No library implements these.
  With ``draws`` other than ``project`` these schemes and ``iid`` replay the reference's
  own NumPy calls instead, sample for sample (``partition_replay``).
* ``domain``: one client per imaging domain (``resources/domains``); the training
  split is divided among the domains IID or by Dirichlet label skew; each client's
  val/test come from its own domain's files. ``label_split: authors`` (default) is the GPAF
  authors' per-class Dirichlet split (:func:`dirichlet_per_class`), ``niid_bench`` the
  ``dirichlet`` scheme. ``holdout: official`` (default, the authors' loaders) cuts the official val and
  test splits into near-equal random shares, one per client (in its domain), and the
  global test set is the whole official test split without any domain shift;
  ``label_shares`` gives shares in proportion to the client's training labels (as every
  other scheme) and the global test set is the union of the clients' shifted shares.
* ``center``: GPAF Scenario 2 (PathMNIST): official train split -> client 0, official
  test split -> client 1; each re-split into train/val/test. The official validation
  split comes from the training centre (NCT-CRC-HE-100K, like the train split) and is
  added to client 0's validation data (``official_val_center: true``, default) or left
  out (``false``). Each client's test data is its own centre's; the global test set is
  both clients' test data together.

Indices in the JSON are *pool* indices: positions in the concatenation of the file's
train, val and test splits (offsets in ``pool``), so one format covers every scheme.

A partition records what built it: the SHA-256 of the labels it was drawn from (``labels_sha256``)
and of its own content (``sha256``: scheme, parameters, seed and every index list). Training
checks both where it reads the file (:func:`check_sealed`, :func:`check_labels`): a file edited
after it was built, or drawn from other data, is refused naming the file, never trained on.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmedbench.workflow.io import canonical_json


class PartitionError(ValueError):
    """A partition request that cannot be satisfied (message says which parameter)."""


@dataclass
class Split:
    """Training indices per client (into the train split) and optional per-client data source."""

    train: list[np.ndarray]
    sources: list[str] | None = None


def _check_clients(labels: np.ndarray, num_clients: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(f"num_clients={num_clients} is larger than the {len(labels)} training samples")


def _flwr_partition(labels: np.ndarray, partitioner) -> list[np.ndarray]:
    from datasets import Dataset

    from fedmedbench.compat import patch_datasets_column

    patch_datasets_column()
    # numpy format + column slices: whole columns come back as arrays, not Python rows
    ds = Dataset.from_dict({"label": labels.astype(np.int64), "idx": np.arange(len(labels))}).with_format("numpy")
    partitioner.dataset = ds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            parts = [np.asarray(partitioner.load_partition(0)["idx"][:], dtype=np.int64)]
            # the first load fixed the partitioner's index lists; as arrays, datasets' select()
            # fingerprints them as one buffer instead of pickling every index (seconds at 100k)
            mapping = getattr(partitioner, "_partition_id_to_indices", None)
            if isinstance(mapping, dict):
                for key, value in mapping.items():
                    mapping[key] = np.asarray(value, dtype=np.int64)
            parts += [np.asarray(partitioner.load_partition(i)["idx"][:], dtype=np.int64)
                      for i in range(1, partitioner.num_partitions)]
        except ValueError as exc:
            raise PartitionError(str(exc)) from exc
    return parts


def iid(labels: np.ndarray, num_clients: int, seed: int) -> Split:
    from flwr_datasets.partitioner import IidPartitioner

    _check_clients(labels, num_clients)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(labels))
    parts = _flwr_partition(labels[perm], IidPartitioner(num_partitions=num_clients))
    return Split([np.sort(perm[p]) for p in parts])


def dirichlet(labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_size: int = 10, balance: bool = True) -> Split:
    from flwr_datasets.partitioner import DirichletPartitioner

    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    if min_size * num_clients > len(labels):
        raise PartitionError(
            f"min_size={min_size} x num_clients={num_clients} exceeds the {len(labels)} training samples"
        )
    # NIID-Bench shuffles each class's indices before splitting; flwr-datasets splits in
    # file order, so present the labels in a seeded random order and map back.
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(labels))
    p = DirichletPartitioner(
        num_partitions=num_clients, partition_by="label", alpha=alpha, min_partition_size=min_size,
        self_balancing=balance, shuffle=True, seed=seed,
    )
    try:
        parts = _flwr_partition(labels[perm], p)
    except PartitionError as exc:
        raise PartitionError(
            f"dirichlet partition impossible: min_size={min_size} not reached for alpha={alpha} with "
            f"{num_clients} clients after repeated sampling ({exc}); lower min_size or raise alpha"
        ) from None
    return Split([np.sort(perm[q]) for q in parts])


def pathological(labels: np.ndarray, num_clients: int, seed: int, classes_per_client: int) -> Split:
    from flwr_datasets.partitioner import PathologicalPartitioner

    _check_clients(labels, num_clients)
    n_classes = len(np.unique(labels))
    if not 1 <= classes_per_client <= n_classes:
        raise PartitionError(f"classes_per_client must be in 1..{n_classes}, got {classes_per_client}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(labels))
    p = PathologicalPartitioner(
        num_partitions=num_clients, partition_by="label", num_classes_per_partition=classes_per_client,
        class_assignment_mode="first-deterministic", shuffle=True, seed=seed,
    )
    parts = _flwr_partition(labels[perm], p)
    return Split([np.sort(perm[q]) for q in parts])


def quantity(labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_size: int = 10, max_tries: int = 1000) -> Split:
    """NIID-Bench quantity skew: sizes ~ Dir(alpha), resampled until all >= min_size."""
    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    n = len(labels)
    if min_size * num_clients > n:
        raise PartitionError(f"min_size={min_size} x num_clients={num_clients} exceeds the {n} training samples")
    rng = np.random.default_rng(seed)
    idx = rng.permutation(n)
    for _ in range(max_tries):
        props = rng.dirichlet(np.full(num_clients, alpha))
        if (props * n).min() >= min_size:
            break
    else:
        raise PartitionError(
            f"quantity partition impossible: no Dir({alpha}) draw gave every one of {num_clients} clients "
            f">= {min_size} samples in {max_tries} tries; lower min_size or raise alpha"
        )
    cuts = (np.cumsum(props) * n).astype(int)[:-1]
    return Split([np.sort(p) for p in np.split(idx, cuts)])


def _fls_fill(labels: np.ndarray, sizes: np.ndarray, priors: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """FL-Simulator sampling loop (see module docstring); exhausted classes are refilled."""
    n_classes = priors.shape[1]
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_classes)]
    for c in range(n_classes):
        if priors[:, c].any() and len(pools[c]) == 0:
            raise PartitionError(f"fls partition: class {c} has no training samples but a client prior needs it")
    remaining = [len(p) for p in pools]
    cum = np.cumsum(priors, axis=1)
    left = sizes.astype(np.int64).copy()
    out: list[list[int]] = [[] for _ in range(len(sizes))]
    open_clients = list(np.flatnonzero(left > 0))
    while open_clients:
        k = rng.integers(len(open_clients))
        client = open_clients[k]
        c = min(int(np.searchsorted(cum[client], rng.uniform(0, cum[client, -1]), side="left")), n_classes - 1)
        while priors[client, c] == 0:  # guard against float edges in the cumulative prior
            c = (c + 1) % n_classes
        if remaining[c] == 0:
            remaining[c] = len(pools[c])  # refill the exhausted class
        remaining[c] -= 1
        out[client].append(int(pools[c][remaining[c]]))
        left[client] -= 1
        if left[client] == 0:
            open_clients.pop(k)
    return [np.asarray(o, dtype=np.int64) for o in out]


def _fls_sizes(n: int, num_clients: int) -> np.ndarray:
    """floor(n / N) samples each, client 0 also the remainder: the reference's sizes, so
    client 0's size (the K of its SCAFFOLD-family servers) is the reference's."""
    sizes = np.full(num_clients, n // num_clients, dtype=np.int64)
    sizes[0] += n - int(sizes.sum())
    return sizes


def fls(labels: np.ndarray, num_clients: int, seed: int, alpha: float) -> Split:
    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    n_classes = int(labels.max()) + 1
    priors = rng.dirichlet(np.full(n_classes, alpha), size=num_clients)
    return Split(_fls_fill(labels, _fls_sizes(len(labels), num_clients), priors, rng))


def fls_pathological(labels: np.ndarray, num_clients: int, seed: int, classes_per_client: int) -> Split:
    _check_clients(labels, num_clients)
    n_classes = int(labels.max()) + 1
    if not 1 <= classes_per_client <= n_classes:
        raise PartitionError(f"classes_per_client must be in 1..{n_classes}, got {classes_per_client}")
    rng = np.random.default_rng(seed)
    priors = np.zeros((num_clients, n_classes))
    for i in range(num_clients):
        priors[i, rng.choice(n_classes, size=classes_per_client, replace=False)] = 1.0 / classes_per_client
    return Split(_fls_fill(labels, _fls_sizes(len(labels), num_clients), priors, rng))


def fls_quantity(labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_size: int = 1) -> Split:
    """Quantity skew of the reference: ``min_size`` samples each plus Multinomial(n - N min_size, Dir(alpha))
    of the rest, so every training sample belongs to exactly one client."""
    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    n = len(labels)
    if n < num_clients * min_size:
        raise PartitionError(f"fls_quantity: cannot give {num_clients} clients >= {min_size} of {n} samples")
    rng = np.random.default_rng(seed)
    props = rng.dirichlet(np.full(num_clients, alpha))
    sizes = min_size + rng.multinomial(n - num_clients * min_size, props / props.sum())
    idx = rng.permutation(n)
    cuts = np.cumsum(sizes)[:-1]
    return Split([np.sort(p) for p in np.split(idx, cuts)])


def dirichlet_per_class(labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_ratio: float = 0.1,
                        max_tries: int = 10) -> Split:
    """The GPAF authors' Dirichlet label split (``_dirichlet_split``, dataset_preparation.py).

    Per class c, client shares p_c ~ Dir(alpha 1_K); client k gets floor(p_ck n_c) samples of
    class c and the rounding remainder goes one each to the clients with the fewest. The draw
    is repeated (at most ``max_tries`` times, then the last one is kept) until every client
    would hold int(n min_ratio / K) samples. No self-balancing: a client's share of one class
    does not depend on what it holds of the others.
    """
    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    sizes = np.array([np.sum(labels == c) for c in classes])
    floor_min = int(len(labels) * min_ratio / num_clients)
    for _ in range(max_tries):
        props = rng.dirichlet([alpha] * num_clients, size=len(classes))
        if np.all((props * sizes[:, None]).astype(int).sum(axis=0) >= floor_min):
            break
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c, p in zip(classes, props, strict=True):
        idx = rng.permutation(np.flatnonzero(labels == c))
        counts = (p * len(idx)).astype(int)
        rest = len(idx) - int(counts.sum())
        if rest > 0:
            counts[np.argpartition(counts, rest)[:rest]] += 1
        for k, part in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            parts[k].extend(part.tolist())
    return Split([np.sort(np.asarray(q, dtype=np.int64)) for q in parts])


#: ``label_split`` readings of the domain scheme (default first)
DOMAIN_LABEL_SPLIT = ("authors", "niid_bench")
#: ``holdout`` readings of the domain scheme (default first)
DOMAIN_HOLDOUT = ("official", "label_shares")


def domain(labels: np.ndarray, num_clients: int, seed: int, domains: list[str], alpha: float | None = None,
           min_size: int | None = None,
           label_split: str = "authors", holdout: str = "official") -> Split:
    """One client per domain; training labels IID or Dirichlet (``label_split`` names the algorithm).

    ``min_size`` (default 10) applies to ``niid_bench`` only: the authors' split has its own floor, so
    a ``min_size`` given with it is refused rather than silently unused. ``holdout`` is used by
    :func:`build_partition`.
    """
    if not domains:
        raise PartitionError("domain scheme needs a non-empty 'domains' list (one client per domain)")
    if num_clients != len(domains):
        raise PartitionError(f"domain scheme: num_clients={num_clients} must equal the number of domains ({len(domains)})")
    if label_split not in DOMAIN_LABEL_SPLIT:
        raise PartitionError(f"domain scheme: label_split={label_split!r}; choose from {', '.join(DOMAIN_LABEL_SPLIT)}")
    if holdout not in DOMAIN_HOLDOUT:
        raise PartitionError(f"domain scheme: holdout={holdout!r}; choose from {', '.join(DOMAIN_HOLDOUT)}")
    if min_size is not None and label_split != "niid_bench":
        raise PartitionError(f"domain scheme: min_size applies to label_split: niid_bench, not {label_split!r} "
                             "(its split keeps every client at 10% of an equal share); remove min_size or set label_split")
    if alpha is None:
        split = iid(labels, num_clients, seed)
    elif label_split == "authors":
        split = dirichlet_per_class(labels, num_clients, seed, alpha)
    else:
        split = dirichlet(labels, num_clients, seed, alpha, 10 if min_size is None else min_size)
    return Split(split.train, sources=list(domains))


def official_holdout(scheme: str, params: dict) -> bool:
    """Whether a setting's global test set is the official test split without domain shift (the
    ``domain`` scheme's ``holdout: official``, its default)."""
    return scheme == "domain" and (params or {}).get("holdout", DOMAIN_HOLDOUT[0]) == "official"


def source_names(scheme: str, params: dict) -> list[str]:
    """The data sources a partition of ``scheme`` reads (the run's ``sources`` keys): one per domain for
    the ``domain`` scheme, plus ``base`` where its global test set is the official split; else ``base``."""
    if scheme != "domain":
        return ["base"]
    return [*(params or {}).get("domains", []), *(["base"] if official_holdout(scheme, params) else [])]


def equal_shares(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation of range(n) cut into near-equal parts (the first n mod K one larger)."""
    sizes = np.full(num_clients, n // num_clients)
    sizes[: n % num_clients] += 1
    return [np.sort(q) for q in np.split(rng.permutation(n), np.cumsum(sizes)[:-1])]


SCHEMES: dict[str, Callable[..., Split]] = {
    "iid": iid,
    "dirichlet": dirichlet,
    "pathological": pathological,
    "quantity": quantity,
    "fls": fls,
    "fls_pathological": fls_pathological,
    "fls_quantity": fls_quantity,
    "domain": domain,
}
#: Parameters each scheme accepts (besides labels, num_clients, seed): used for validation.
SCHEME_PARAMS = {
    "iid": set(),
    "dirichlet": {"alpha", "min_size", "balance"},
    "pathological": {"classes_per_client"},
    "quantity": {"alpha", "min_size"},
    "fls": {"alpha"},
    "fls_pathological": {"classes_per_client"},
    "fls_quantity": {"alpha", "min_size"},
    "domain": {"domains", "alpha", "min_size", "label_split", "holdout"},
    "center": {"val_fraction_center", "test_fraction_center", "official_val_center"},
}
ALL_SCHEMES = tuple(SCHEME_PARAMS)


def proportional_allocation(labels: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``labels``' indices among clients per class in proportion to ``weights[client, class]``.

    Largest-remainder rounding; a class no client trained on is spread evenly. The
    result is disjoint and covers every index.
    """
    n_clients, n_classes = weights.shape
    out: list[list[int]] = [[] for _ in range(n_clients)]
    for c in range(n_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) == 0:
            continue
        w = weights[:, c].astype(float) if c < weights.shape[1] else np.zeros(n_clients)
        if w.sum() == 0:
            w = np.ones(n_clients)
        share = w / w.sum() * len(idx)
        counts = np.floor(share).astype(int)
        for j in np.argsort(-(share - counts), kind="stable")[: len(idx) - counts.sum()]:
            counts[j] += 1
        for j, part in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            out[j].extend(part.tolist())
    return [np.sort(np.asarray(o, dtype=np.int64)) for o in out]


def label_counts(labels: np.ndarray, parts: list[np.ndarray], n_classes: int) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=n_classes) for p in parts]) if parts else np.zeros((0, n_classes), int)


def _center(split_labels: dict[str, np.ndarray], seed: int, val_fraction: float, test_fraction: float,
            official_val: bool = True) -> list[dict]:
    """GPAF Scenario 2: train split -> client 0, test split -> client 1, each re-split; official val -> client 0's val."""
    rng = np.random.default_rng(seed)
    offsets = _offsets(split_labels)
    clients = []
    for cid, split in enumerate(("train", "test")):
        n = len(split_labels[split])
        perm = rng.permutation(n)
        n_test = int(round(test_fraction * n))
        n_val = int(round(val_fraction * n))
        if n - n_test - n_val < 1:
            raise PartitionError(f"center scheme: val/test fractions leave no training data for client {cid}")
        test, val, train = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
        base = offsets[split]
        clients.append({"train": np.sort(train) + base, "val": np.sort(val) + base, "test": np.sort(test) + base})
    if official_val:  # the official val split is from the training centre
        extra = np.arange(len(split_labels["val"]), dtype=np.int64) + offsets["val"]
        clients[0]["val"] = np.concatenate([clients[0]["val"], extra])
    return clients


def _offsets(split_labels: dict[str, np.ndarray]) -> dict[str, int]:
    n_train, n_val = len(split_labels["train"]), len(split_labels["val"])
    return {"train": 0, "val": n_train, "test": n_train + n_val}


def build_partition(
    split_labels: dict[str, np.ndarray], scheme: str, num_clients: int, seed: int, params: dict, num_classes: int | None = None,
    draws: str = "project",
) -> dict:
    """Partition a dataset whose labels per split are ``split_labels``; return the JSON document.

    Document: ``{scheme, params, seed, num_clients, num_classes, pool, clients: [{id, source,
    train, val, test}], global_test: [{source, idx}]}``; indices are pool indices. ``draws`` other
    than ``project`` replays the early-stopping authors' draws (``partition_replay``): the document
    then also holds ``random_draws: reference`` and ``rng_after_partition`` (the legacy generator's
    state after the partition, where the cache-building run's client draws start).
    """
    from fedmedbench.partition import replay as partition_replay

    if draws not in partition_replay.DRAWS:
        raise PartitionError(f"random_draws = {draws!r}; choose from {', '.join(partition_replay.DRAWS)}")
    if scheme not in SCHEME_PARAMS:
        raise PartitionError(f"unknown partition scheme '{scheme}'; choose from {', '.join(ALL_SCHEMES)}")
    unknown = set(params) - SCHEME_PARAMS[scheme]
    if unknown:
        raise PartitionError(f"scheme '{scheme}' does not take parameter(s) {sorted(unknown)}; it takes {sorted(SCHEME_PARAMS[scheme])}")
    n_classes = int(max(int(v.max()) for v in split_labels.values() if len(v)) + 1)
    if num_classes is not None:
        if num_classes < n_classes:
            raise PartitionError(f"labels go up to {n_classes - 1} but the dataset has {num_classes} classes")
        n_classes = num_classes
    offsets = _offsets(split_labels)
    pool = {s: [offsets[s], offsets[s] + len(split_labels[s])] for s in ("train", "val", "test")}
    extra: dict = {}
    if scheme == "center":
        if draws != "project":
            raise PartitionError(f"random_draws = {draws}: the center scheme has no reference draws")
        if num_clients != 2:
            raise PartitionError(f"center scheme has exactly 2 clients (train center, test center), got num_clients={num_clients}")
        clients = _center(split_labels, seed, params.get("val_fraction_center", 0.1), params.get("test_fraction_center", 0.2),
                          bool(params.get("official_val_center", True)))
        sources = ["base", "base"]
        global_test = [{"source": "base", "idx": np.concatenate([c["test"] for c in clients])}]
    else:
        if draws == "project":
            result = SCHEMES[scheme](split_labels["train"], num_clients, seed, **params)
        else:
            try:
                replayed = partition_replay.replay_partition(scheme, split_labels["train"], num_clients, seed, params, n_classes)
            except partition_replay.ReplayError as exc:
                raise PartitionError(f"random_draws = {draws}: {exc}") from None
            result = Split(replayed.train)
            extra = {"random_draws": "reference", "rng_after_partition": replayed.state_after}
        train = result.train
        if any(len(t) == 0 for t in train):
            empty = [i for i, t in enumerate(train) if len(t) == 0]
            raise PartitionError(f"scheme '{scheme}' left client(s) {empty} without training data; use fewer clients")
        rng = np.random.default_rng([seed, 7])
        official = official_holdout(scheme, params)
        if official:  # the GPAF authors' loaders: equal random shares of the official val/test splits
            vals = equal_shares(len(split_labels["val"]), num_clients, rng)
            tests = equal_shares(len(split_labels["test"]), num_clients, rng)
        else:
            weights = label_counts(split_labels["train"], train, n_classes)
            vals = proportional_allocation(split_labels["val"], weights, rng)
            tests = proportional_allocation(split_labels["test"], weights, rng)
        sources = result.sources or ["base"] * num_clients
        clients = [
            {"train": train[i], "val": vals[i] + offsets["val"], "test": tests[i] + offsets["test"]}
            for i in range(num_clients)
        ]
        if result.sources and not official:
            global_test = [{"source": sources[i], "idx": clients[i]["test"]} for i in range(num_clients)]
        else:
            global_test = [{"source": "base", "idx": np.arange(*pool["test"])}]
    return seal({
        "scheme": scheme,
        "params": params,
        "seed": seed,
        "num_clients": num_clients,
        "num_classes": n_classes,
        "pool": pool,
        "clients": [
            {"id": i, "source": sources[i], **{k: np.asarray(v).tolist() for k, v in c.items()}}
            for i, c in enumerate(clients)
        ],
        "global_test": [{"source": g["source"], "idx": np.asarray(g["idx"]).tolist()} for g in global_test],
        **extra,
        LABELS_KEY: labels_digest(pool_labels(split_labels)),
    })


#: a partition's own digest: SHA-256 of its canonical JSON without this key
DIGEST_KEY = "sha256"
#: SHA-256 of the labels (pool order) the partition was drawn from
LABELS_KEY = "labels_sha256"
#: the partition file's format, a param of rule build_partition: a file of an older format (2: the first that
#: records ``sha256`` and ``labels_sha256``) is rebuilt by Snakemake, not refused at training
FILE_FORMAT = 2
#: what to do with a partition that fails a check of what built it
REBUILD = "delete it and run snakemake again to rebuild it (its runs are then trained again)"


def labels_digest(labels: Any) -> str:
    """SHA-256 of class labels in pool order (as 64-bit integers, whatever their stored dtype and shape)."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(labels).reshape(-1), dtype=np.int64).tobytes()).hexdigest()


def content_digest(doc: dict) -> str:
    """SHA-256 of a partition document without its ``sha256`` key (its canonical JSON)."""
    return hashlib.sha256(canonical_json({k: v for k, v in doc.items() if k != DIGEST_KEY})).hexdigest()


def seal(doc: dict) -> dict:
    """``doc`` with the digest of its content recorded (``sha256``)."""
    doc[DIGEST_KEY] = content_digest(doc)
    return doc


def check_sealed(doc: dict, path: str) -> None:
    """A partition read back holds the digest recorded when it was built, and still matches it."""
    recorded = doc.get(DIGEST_KEY)
    if not isinstance(recorded, str):
        raise PartitionError(f"{path}: the partition records no '{DIGEST_KEY}' of its content (written by hand or by an "
                             f"older fedmedbench), so an edit would go unseen; {REBUILD}")
    if content_digest(doc) != recorded:
        raise PartitionError(f"{path}: the partition no longer matches the '{DIGEST_KEY}' recorded when it was built "
                             f"(its index lists, scheme, parameters or seed were edited); {REBUILD}")


def check_labels(doc: dict, source: str, labels: Any, data_path: str, path: str) -> None:
    """The labels of ``source`` (read from ``data_path``) are the ones the partition was drawn from."""
    recorded = doc.get(LABELS_KEY)
    if recorded is not None and labels_digest(labels) != recorded:
        raise PartitionError(f"{path}: drawn from other data than {data_path} (source '{source}': its labels differ from "
                             f"those the partition was built from); {REBUILD}")


def pool_labels(split_labels: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([split_labels["train"], split_labels["val"], split_labels["test"]])


def stats_frame(doc: dict, split_labels: dict[str, np.ndarray]):
    """Per-client label counts for each part (train/val/test): a long-format DataFrame."""
    import pandas as pd

    labels = pool_labels(split_labels)
    rows = []
    for c in doc["clients"]:
        for part in ("train", "val", "test"):
            counts = np.bincount(labels[np.asarray(c[part], dtype=np.int64)], minlength=doc["num_classes"])
            rows.append({"client": c["id"], "source": c["source"], "part": part, "n": int(counts.sum()),
                         **{f"class_{k}": int(v) for k, v in enumerate(counts)}})
    return pd.DataFrame(rows)


#: the keys each entry of a partition document holds (what training reads from it)
CLIENT_KEYS = ("source", "train", "val", "test")
GLOBAL_TEST_KEYS = ("source", "idx")
DOCUMENT_KEYS = ("num_classes", "clients", "global_test")


def check_partition_keys(doc: Any, path: str) -> None:
    """A partition read back (perhaps edited by hand) holds every key training reads: the document's
    ``num_classes``, ``clients`` and ``global_test``, each client's ``source``, ``train``, ``val``, ``test``, each
    global test entry's ``source`` and ``idx`` (a missing one would be a bare ``KeyError`` mid-run); ``num_classes``
    a whole number."""
    if not isinstance(doc, dict):
        raise PartitionError(f"{path}: a partition is a JSON object with keys {', '.join(DOCUMENT_KEYS)}, "
                             f"not a {type(doc).__name__}")
    for key in DOCUMENT_KEYS:
        if key not in doc:
            raise PartitionError(f"{path}: the partition has no '{key}' key")
    classes = doc["num_classes"]
    if isinstance(classes, bool) or not isinstance(classes, int | np.integer) or classes < 1:
        raise PartitionError(f"{path}: 'num_classes' must be a whole number >= 1, not {classes!r}")
    for name, keys, what in (("clients", CLIENT_KEYS, "client"), ("global_test", GLOBAL_TEST_KEYS, "global test entry")):
        if not isinstance(doc[name], list):
            raise PartitionError(f"{path}: '{name}' must be a list, not a {type(doc[name]).__name__}")
        for i, entry in enumerate(doc[name]):
            if not isinstance(entry, dict):
                raise PartitionError(f"{path}: {what} {i} must be an object with keys {', '.join(keys)}")
            who = f"{what} {entry.get('id', i) if name == 'clients' else i}"
            missing = [k for k in keys if k not in entry]
            if missing:
                raise PartitionError(f"{path}: {who} has no '{missing[0]}' key (each {what} holds {', '.join(keys)})")


def check_partition(doc: dict, pool_sizes: dict[str, int], path: str) -> None:
    """A partition read back (perhaps edited by hand) before training: every index is a whole number inside
    its source's pool (a negative one would silently count from the end), and no sample a client trains on is
    also a validation or test sample of the same source. ``pool_sizes``: source name -> pool length."""
    check_partition_keys(doc, path)
    held: dict[str, dict[int, str]] = {}  # source -> index -> where it is held out
    parts = [(f"client {c.get('id', i)}", c["source"], part, c[part])
             for i, c in enumerate(doc["clients"]) for part in ("train", "val", "test")]
    parts += [("global test set", g["source"], "idx", g["idx"]) for g in doc["global_test"]]
    arrays = {}
    for who, source, part, idx in parts:
        if source not in pool_sizes:
            continue  # a source the caller does not load is checked where it is loaded
        try:
            arr = np.asarray(idx)
        except ValueError:  # a ragged list (an index written as a list)
            arr = None
        if arr is None or arr.ndim != 1:
            raise PartitionError(f"{path}: {who} {part} list must be a flat list of sample indices")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise PartitionError(f"{path}: {who} {part} list holds non-integer entries (e.g. {idx[0]!r})")
        arr = arr.astype(np.int64, copy=False)
        n = pool_sizes[source]
        bad = arr[(arr < 0) | (arr >= n)]
        if bad.size:
            raise PartitionError(f"{path}: {who} {part} index {int(bad[0])} is outside the pool of source '{source}' "
                                 f"(0..{n - 1}); the partition does not belong to this dataset or was edited")
        arrays[(who, source, part)] = arr
        if part != "train":
            for i in arr.tolist():
                held.setdefault(source, {}).setdefault(i, f"{who} {part}")
    for (who, source, part), arr in arrays.items():
        if part != "train" or source not in held:
            continue
        for i in arr.tolist():
            if i in held[source]:
                raise PartitionError(f"{path}: {who} trains on sample {i} of source '{source}', which is also in "
                                     f"{held[source][i]} list: training data must not be held-out data")


HOLDOUT_PARTS = ("val", "test")


def holdout_shortfall(num_clients: int, counts: dict[str, int]) -> list[str]:
    """The held-out splits (val, test) with fewer samples than clients: some clients get none of them, so they
    have no local score and ``local_mean_*`` averages the others. Empty when every client can get one."""
    return [f"{part} ({counts[part]} samples)" for part in HOLDOUT_PARTS if counts.get(part, num_clients) < num_clients]


def clients_without_holdout(doc: dict) -> dict[str, list[int]]:
    """Per held-out split, the clients of a partition document that got no sample of it."""
    return {part: [i for i, c in enumerate(doc["clients"]) if len(c[part]) == 0] for part in HOLDOUT_PARTS}


def holdout_warning(doc: dict) -> str | None:
    """One line naming the clients without validation or test data (None when every client has both)."""
    empty = {part: ids for part, ids in clients_without_holdout(doc).items() if ids}
    if not empty:
        return None
    said = "; ".join(f"client(s) {ids} have no {part} data" for part, ids in empty.items())
    return (f"{said}: they get no local score, and local_mean_*/local_std_* average the other clients "
            "(summary.json lists them under clients_without_local_scores); use fewer clients to give each some")
