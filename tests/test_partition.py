"""Every partition scheme: coverage, disjointness, determinism and the skew it promises."""

from __future__ import annotations

import numpy as np
import pytest

from fedmedbench.partition import schemes as P

N_CLASSES = 7


@pytest.fixture(scope="module")
def labels():
    rng = np.random.default_rng(0)
    return {"train": rng.integers(0, N_CLASSES, 3000), "val": rng.integers(0, N_CLASSES, 400),
            "test": rng.integers(0, N_CLASSES, 700)}


def _train(doc):
    return [np.asarray(c["train"]) for c in doc["clients"]]


def _class_share(doc, labels):
    pool = P.pool_labels(labels)
    return np.stack([np.bincount(pool[t], minlength=N_CLASSES) / len(t) for t in _train(doc)])


def _mean_tv_from_global(doc, labels):
    """Mean total-variation distance between client label distributions and the global one."""
    glob = np.bincount(labels["train"], minlength=N_CLASSES) / len(labels["train"])
    return float(np.mean(0.5 * np.abs(_class_share(doc, labels) - glob).sum(1)))


DISJOINT = [("iid", {}), ("dirichlet", {"alpha": 0.5}), ("pathological", {"classes_per_client": 2}),
            ("quantity", {"alpha": 0.5}), ("fls_quantity", {"alpha": 0.5}), ("domain", {"domains": ["a", "b", "c"]})]


@pytest.mark.parametrize("scheme,params", DISJOINT)
def test_disjoint_schemes_cover_train_exactly_once(labels, scheme, params):
    n = 3 if scheme == "domain" else 10
    doc = P.build_partition(labels, scheme, n, 0, params)
    allidx = np.concatenate(_train(doc))
    assert len(allidx) == len(np.unique(allidx))  # disjoint
    assert len(allidx) == len(labels["train"])


@pytest.mark.parametrize("scheme,params", DISJOINT + [("fls", {"alpha": 0.1}), ("fls_pathological", {"classes_per_client": 2})])
def test_val_test_disjoint_cover_and_follow_client_labels(labels, scheme, params):
    n = 3 if scheme == "domain" else 10
    if scheme == "domain":  # the label-following holdout; the default is the official one (tested below)
        params = {**params, "holdout": "label_shares"}
    doc = P.build_partition(labels, scheme, n, 0, params)
    for part, (lo, hi) in (("val", doc["pool"]["val"]), ("test", doc["pool"]["test"])):
        idx = np.concatenate([np.asarray(c[part]) for c in doc["clients"]])
        assert len(idx) == len(np.unique(idx)) == hi - lo
        assert idx.min() >= lo and idx.max() < hi
    if scheme != "domain":  # the server's test set is the whole official test split
        assert doc["global_test"] == [{"source": "base", "idx": list(range(*doc["pool"]["test"]))}]
    # a client with no training samples of class k gets no test samples of class k
    pool = P.pool_labels(labels)
    for c in doc["clients"]:
        train_classes = set(np.unique(pool[np.asarray(c["train"])]))
        test_classes = set(np.unique(pool[np.asarray(c["test"], dtype=int)])) if c["test"] else set()
        assert test_classes <= train_classes


@pytest.mark.parametrize("scheme,params", DISJOINT + [("fls", {"alpha": 0.1}), ("center", {})])
def test_deterministic_by_seed(labels, scheme, params):
    n = {"domain": 3, "center": 2}.get(scheme, 10)
    a = P.build_partition(labels, scheme, n, 5, params)
    b = P.build_partition(labels, scheme, n, 5, params)
    c = P.build_partition(labels, scheme, n, 6, params)
    assert a == b
    assert a["clients"] != c["clients"]


def test_dirichlet_skew_grows_as_alpha_shrinks(labels):
    iid = _mean_tv_from_global(P.build_partition(labels, "iid", 10, 0, {}), labels)
    mild = _mean_tv_from_global(P.build_partition(labels, "dirichlet", 10, 0, {"alpha": 10.0}), labels)
    strong = _mean_tv_from_global(P.build_partition(labels, "dirichlet", 10, 0, {"alpha": 0.1}), labels)
    assert iid < 0.08 and mild < strong and strong > 0.4


def test_dirichlet_min_size_and_impossible_request(labels):
    doc = P.build_partition(labels, "dirichlet", 10, 0, {"alpha": 0.3, "min_size": 20})
    assert min(len(t) for t in _train(doc)) >= 20
    with pytest.raises(P.PartitionError, match="min_size"):
        P.build_partition(labels, "dirichlet", 100, 0, {"alpha": 0.01, "min_size": 29})
    with pytest.raises(P.PartitionError, match="exceeds"):
        P.build_partition(labels, "dirichlet", 10, 0, {"alpha": 0.5, "min_size": 400})


def test_pathological_gives_exactly_k_classes(labels):
    doc = P.build_partition(labels, "pathological", 10, 0, {"classes_per_client": 2})
    pool = P.pool_labels(labels)
    for i, t in enumerate(_train(doc)):
        classes = np.unique(pool[t])
        assert len(classes) == 2
        assert i % N_CLASSES in classes  # NIID-Bench: client i holds class i mod K


def test_quantity_skews_sizes_not_labels(labels):
    doc = P.build_partition(labels, "quantity", 10, 0, {"alpha": 0.3})
    sizes = np.array([len(t) for t in _train(doc)])
    assert sizes.max() > 3 * sizes.min() and sizes.min() >= 10
    shares = _class_share(doc, labels)[sizes > 100]
    glob = np.bincount(labels["train"], minlength=N_CLASSES) / len(labels["train"])
    assert np.abs(shares - glob).max() < 0.1  # label mix stays near global
    with pytest.raises(P.PartitionError, match="quantity partition impossible"):
        P.quantity(labels["train"], 50, 0, alpha=0.01, min_size=50, max_tries=20)


def test_fls_sizes_refill_and_prior_skew(labels):
    doc = P.build_partition(labels, "fls", 10, 0, {"alpha": 0.05})
    sizes = {len(t) for t in _train(doc)}
    assert sizes == {len(labels["train"]) // 10}
    allidx = np.concatenate(_train(doc))
    assert len(np.unique(allidx)) < len(allidx)  # exhausted classes were refilled (repeats)
    assert _mean_tv_from_global(doc, labels) > 0.4
    iidish = P.build_partition(labels, "fls", 10, 0, {"alpha": 100.0})
    assert _mean_tv_from_global(iidish, labels) < 0.1


@pytest.mark.parametrize("scheme,params", [("fls", {"alpha": 0.1}), ("fls_pathological", {"classes_per_client": 2})])
def test_fls_client0_takes_the_remainder(scheme, params):
    """dataset.py: floor(n / N) samples each and client 0 the remainder (7007 / 100 -> 77, 70, ..., 70)."""
    labels = {"train": np.arange(7007) % N_CLASSES, "val": np.arange(70) % N_CLASSES,
              "test": np.arange(140) % N_CLASSES}
    doc = P.build_partition(labels, scheme, 100, 0, params)
    sizes = [len(t) for t in _train(doc)]
    assert sizes[0] == 77 and set(sizes[1:]) == {70} and sum(sizes) == 7007


def test_fls_quantity_is_min_size_plus_a_multinomial_share():
    """dataset.py: 1 sample each plus Multinomial(n - N, Dir(alpha)): every sample used, once."""
    labels = {"train": np.arange(1003) % N_CLASSES, "val": np.arange(70) % N_CLASSES,
              "test": np.arange(140) % N_CLASSES}
    for alpha in (0.01, 1.0):
        doc = P.build_partition(labels, "fls_quantity", 100, 0, {"alpha": alpha})
        parts = _train(doc)
        allidx = np.concatenate(parts)
        assert np.array_equal(np.sort(allidx), np.arange(1003))
        sizes = np.array([len(t) for t in parts])
        assert sizes.min() >= 1
        if alpha == 0.01:  # the mass goes to a few clients, the others keep their one sample
            assert (sizes == 1).sum() > 80 and sizes.max() > 300
    doc = P.build_partition(labels, "fls_quantity", 10, 0, {"alpha": 0.5, "min_size": 100})
    assert min(len(t) for t in _train(doc)) >= 100
    with pytest.raises(P.PartitionError, match="cannot give"):
        P.fls_quantity(labels["train"], 10, 0, alpha=0.5, min_size=101)


def test_fls_pathological_k_classes(labels):
    doc = P.build_partition(labels, "fls_pathological", 10, 0, {"classes_per_client": 3})
    pool = P.pool_labels(labels)
    assert all(len(np.unique(pool[t])) <= 3 for t in _train(doc))


def test_domain_scheme_sources_and_global_test(labels):
    doc = P.build_partition(labels, "domain", 3, 0, {"domains": ["clean", "mid", "bad"], "alpha": 0.5, "min_size": 5,
                                                     "label_split": "niid_bench", "holdout": "label_shares"})
    assert [c["source"] for c in doc["clients"]] == ["clean", "mid", "bad"]
    assert [g["source"] for g in doc["global_test"]] == ["clean", "mid", "bad"]
    total = sum(len(g["idx"]) for g in doc["global_test"])
    assert total == len(labels["test"])
    with pytest.raises(P.PartitionError, match="must equal the number of domains"):
        P.build_partition(labels, "domain", 4, 0, {"domains": ["a", "b"]})
    with pytest.raises(P.PartitionError, match="min_size applies to label_split: niid_bench"):  # not silently unused
        P.build_partition(labels, "domain", 3, 0, {"domains": ["clean", "mid", "bad"], "alpha": 0.5, "min_size": 5})


def test_center_scheme(labels):
    doc = P.build_partition(labels, "center", 2, 0, {"val_fraction_center": 0.1, "test_fraction_center": 0.2})
    c0, c1 = doc["clients"]
    lo, hi = doc["pool"]["train"]
    assert all(lo <= i < hi for i in c0["train"] + c0["test"])
    tlo, thi = doc["pool"]["test"]
    assert all(tlo <= i < thi for i in c1["train"] + c1["val"] + c1["test"])
    vlo, vhi = doc["pool"]["val"]
    official = [i for i in c0["val"] if vlo <= i < vhi]
    assert sorted(official) == list(range(vlo, vhi))  # the official val split (training centre) is client 0's
    assert not any(vlo <= i < vhi for i in c1["train"] + c1["val"] + c1["test"] + c0["train"] + c0["test"])
    assert len(c0["train"]) + len(c0["val"]) + len(c0["test"]) == len(labels["train"]) + len(labels["val"])
    dropped = P.build_partition(labels, "center", 2, 0, {"official_val_center": False})["clients"][0]
    assert not any(vlo <= i < vhi for i in dropped["val"])
    assert len(dropped["train"]) + len(dropped["val"]) + len(dropped["test"]) == len(labels["train"])
    with pytest.raises(P.PartitionError, match="exactly 2 clients"):
        P.build_partition(labels, "center", 3, 0, {})


@pytest.mark.parametrize("bad,match", [
    (dict(scheme="nope", num_clients=2, params={}), "unknown partition scheme"),
    (dict(scheme="iid", num_clients=0, params={}), "num_clients must be >= 1"),
    (dict(scheme="iid", num_clients=10**6, params={}), "larger than"),
    (dict(scheme="dirichlet", num_clients=5, params={"alpha": 0.0}), "alpha must be > 0"),
    (dict(scheme="iid", num_clients=5, params={"alpha": 1.0}), "does not take"),
    (dict(scheme="pathological", num_clients=5, params={"classes_per_client": 99}), "classes_per_client"),
])
def test_bad_requests_fail_clearly(labels, bad, match):
    with pytest.raises(P.PartitionError, match=match):
        P.build_partition(labels, bad["scheme"], bad["num_clients"], 0, bad["params"])


def test_domain_holdout_official_is_equal_shares_and_a_clean_official_test_set(labels):
    """GPAF authors' loaders: each client's val/test is an equal random share of the official split
    (label-blind), and the server's test set is the whole official test split without domain shift."""
    doc = P.build_partition(labels, "domain", 3, 0, {"domains": ["clean", "mid", "old"], "alpha": 0.1})
    lo, hi = doc["pool"]["test"]
    assert doc["global_test"] == [{"source": "base", "idx": list(range(lo, hi))}]
    for part in ("val", "test"):
        sizes = [len(c[part]) for c in doc["clients"]]
        assert max(sizes) - min(sizes) <= 1
        assert sum(sizes) == len(labels[part])
    assert [c["source"] for c in doc["clients"]] == ["clean", "mid", "old"]  # shares read in the client's domain
    old = P.build_partition(labels, "domain", 3, 0, {"domains": ["clean", "mid", "old"], "alpha": 0.1,
                                                      "holdout": "label_shares"})
    assert [g["source"] for g in old["global_test"]] == ["clean", "mid", "old"]


def test_domain_label_split_authors_has_no_self_balancing():
    """The authors' per-class Dir(alpha) split: a client can hold more than n/K samples of every class
    (each class is split independently); NIID-Bench's self-balancing gives a client already above
    n/K nothing of the next class, so no client can exceed n/K in both classes."""
    y = np.repeat([0, 1], 900)
    both_large = {}
    for name in ("authors", "niid_bench"):
        hits = 0
        for seed in range(30):
            split = P.domain(y, 3, seed, ["a", "b", "c"], alpha=0.1, label_split=name)
            counts = np.stack([np.bincount(y[t], minlength=2) for t in split.train])
            assert counts.sum() == len(y) and len(np.unique(np.concatenate(split.train))) == len(y)
            hits += int(np.any(np.all(counts > len(y) / 3, axis=1)))
        both_large[name] = hits
    assert both_large["authors"] > 0 and both_large["niid_bench"] == 0
    default = P.domain(y, 3, 0, ["a", "b", "c"], alpha=0.1)
    assert all(np.array_equal(a, b) for a, b in zip(default.train, P.dirichlet_per_class(y, 3, 0, 0.1).train, strict=True))



def test_source_names_follow_the_holdout(labels):
    """What a setting's runs must be given: the domain files, and ``base`` where the global test set is the
    official split (the default holdout) or the scheme has no domains; exactly what the partition reads."""
    doms = {"domains": ["clean", "mid"], "alpha": 0.5}
    assert P.source_names("domain", doms) == ["clean", "mid", "base"]
    assert P.source_names("domain", {**doms, "holdout": "label_shares"}) == ["clean", "mid"]
    assert P.source_names("dirichlet", {"alpha": 0.5}) == ["base"]
    for params in (doms, {**doms, "holdout": "label_shares"}):
        doc = P.build_partition(labels, "domain", 2, 0, params)
        read = {c["source"] for c in doc["clients"]} | {g["source"] for g in doc["global_test"]}
        assert read == set(P.source_names("domain", params))
