"""Snakemake entry: a synthetic file in the exact MedMNIST schema (demo/test data, not real)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.data import synthetic
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, s = snakemake.wildcards, snakemake.params.synthetic
    counts = synthetic.default_counts(w.dataset, {"train": s["max_train"], "val": s["max_val"], "test": s["max_test"]})
    arrays = synthetic.generate(w.dataset, int(w.size), seed=s["seed"], counts=counts, difficulty=s["difficulty"],
                                imbalance=s["imbalance"])
    io.write_npz(snakemake.output[0], arrays)
    log(f"SYNTHETIC {w.dataset} {w.size}px, difficulty {s['difficulty']}, imbalance {s['imbalance']}: {counts}")
