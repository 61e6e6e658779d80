"""Data-layer speed: partitioning 100k labels per scheme, client-domain corruption throughput
(GPAF's acquisition profiles, and its MedMNIST-C chains through ``fedmedbench.data.domains`` vs
calling medmnistc directly on the same images), synthetic MedMNIST generation time.

    python bench/data_speed.py [--out bench/results.jsonl]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit  # noqa: E402

from fedmedbench import compat  # noqa: E402
from fedmedbench.data import domains, synthetic  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402

#: every scheme with typical parameters (100 clients, 10 classes)
SCHEME_CASES = {
    "iid": {},
    "dirichlet": {"alpha": 0.5, "min_size": 10},
    "pathological": {"classes_per_client": 2},
    "quantity": {"alpha": 0.5, "min_size": 10},
    "fls": {"alpha": 0.1},
    "fls_pathological": {"classes_per_client": 2},
    "fls_quantity": {"alpha": 0.1},
}


def bench_partitions(n: int = 100_000, clients: int = 100) -> list[dict]:
    t0 = time.perf_counter()
    import flwr_datasets.partitioner  # noqa: F401  (one-off import cost, reported on its own)

    rows = [{"bench": "partition_import", "seconds": round(time.perf_counter() - t0, 3)}]
    rng = np.random.default_rng(0)
    labels = {"train": rng.integers(0, 10, n), "val": rng.integers(0, 10, n // 10), "test": rng.integers(0, 10, n // 5)}
    for scheme, params in SCHEME_CASES.items():
        t0 = time.perf_counter()
        P.build_partition(labels, scheme, clients, 0, params, num_classes=10)
        rows.append({"bench": "partition", "scheme": scheme, "labels": n, "clients": clients,
                     "seconds": round(time.perf_counter() - t0, 3)})
    return rows


def _direct_medmnistc(images: np.ndarray, spec: list[dict]) -> np.ndarray:
    """The same corruption chain as bare medmnistc calls, as ``domains`` applies it: each corruption on
    the grey image at its own resolution (none of the chains timed needs the large canvas)."""
    compat.patch_medmnistc()
    from medmnistc.corruptions import registry

    assert not any(s["corruption"] in domains.LARGE_CANVAS for s in spec)
    chain = [getattr(registry, domains.CORRUPTION_CLASSES[s["corruption"]])(severity_params=list(s["range"])) for s in spec]
    out = np.empty_like(images)
    for i, img in enumerate(images):
        pil = Image.fromarray(img)
        for c in chain:
            arr = np.clip(np.asarray(c.apply(pil, augmentation=True)), 0, 255).astype(np.uint8)
            pil = Image.fromarray(arr).convert("L")
        out[i] = np.asarray(pil)
    return out


#: the GPAF domains timed: the acquisition profiles (the study's default, no medmnistc chain to compare
#: with) and the MedMNIST-C chains, each also run as bare medmnistc calls
CORRUPTION_DOMAINS = ("midrange", "degraded", "midrange_medmnistc", "degraded_medmnistc")


def bench_corruptions(count: int = 200) -> list[dict]:
    images = synthetic.generate("breastmnist", 28, seed=0, counts={"train": count, "val": 1, "test": 1})["train_images"]
    rows = []
    for domain in CORRUPTION_DOMAINS:
        spec = domains.GPAF_SCENARIO1[domain]
        steps = domains.build_steps("breastmnist", spec, domain)
        t0 = time.perf_counter()
        domains.corrupt_images(images, steps, 0, domain, "train")
        ours = count / (time.perf_counter() - t0)
        row = {"bench": "corruption", "domain": domain, "images": count, "ours_img_s": round(ours, 1)}
        if all("corruption" in step for step in spec):
            t0 = time.perf_counter()
            _direct_medmnistc(images, spec)
            direct = count / (time.perf_counter() - t0)
            row.update(direct_img_s=round(direct, 1), ratio=round(ours / direct, 3))
        rows.append(row)
    return rows


def bench_synthetic() -> list[dict]:
    rows = []
    for flag, size, counts in (("dermamnist", 64, {"train": 7007, "val": 1003, "test": 2005}),
                               ("breastmnist", 28, {"train": 546, "val": 78, "test": 156})):
        t0 = time.perf_counter()
        synthetic.generate(flag, size, seed=0, counts=counts)
        n = sum(counts.values())
        rows.append({"bench": "synthetic", "flag": flag, "size": size, "images": n,
                     "seconds": round(time.perf_counter() - t0, 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = bench_partitions() + bench_corruptions() + bench_synthetic()
    emit(rows, args.out)


if __name__ == "__main__":
    main()
