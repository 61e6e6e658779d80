"""Engine overhead: N FedAvg rounds through the pipeline's Flower engine vs a plain PyTorch loop.

Both sides do the same work in one process with the same threads: the same initial model
(seeded), the same sampled clients per round (seeded by (seed, round)), the same local
SGD steps from the same per-(seed, round, client) batch generators, uniform averaging,
and one evaluation of the final model on the global test/validation sets and every
client's test split. The final weights must be bit-identical (checked), so the ratio of
wall times is the cost of everything the engine adds: Flower messages, the per-client
model rebuild and state store, per-round checkpoints, metric rows and output files.

    python bench/engine_overhead.py --model cnn_small --clients 100 --per-round 10 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit  # noqa: E402

from fedmedbench import io  # noqa: E402
from fedmedbench import partition as P  # noqa: E402
from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.fl import engine  # noqa: E402
from fedmedbench.fl import federation as fed  # noqa: E402
from fedmedbench.fl.registry import load_arrays, model_arrays, weighted_average  # noqa: E402
from fedmedbench.fl.spec import RunSpec  # noqa: E402
from fedmedbench.fl.tasks import _task_cached, task_for  # noqa: E402
from fedmedbench.fl.training import local_sgd  # noqa: E402

#: DermaMNIST's official split sizes (the earlystop study's per-round work at 64 px)
DERMA_COUNTS = {"train": 7007, "val": 1003, "test": 2005}


def make_data(workdir: Path, clients: int, seed: int = 0) -> tuple[Path, Path]:
    arrays = synthetic.generate("dermamnist", 64, seed=seed, counts=DERMA_COUNTS)
    npz = workdir / "dermamnist_64.npz"
    io.write_npz(npz, arrays)
    labels = {s: arrays[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")}
    part = workdir / "partition.json"
    io.write_json(part, P.build_partition(labels, "fls", clients, seed, {"alpha": 0.1}, num_classes=7))
    return npz, part


def make_spec(workdir: Path, npz: Path, part: Path, model: str, rounds: int, per_round: int, threads: int, backend: str,
              local_epochs: float = 5) -> RunSpec:
    return RunSpec(
        run_dir=str(workdir / f"run-{model}-{backend}"), study="bench", dataset="dermamnist", setting="dir0.1",
        method="fedavg", seed=0, partition_path=str(part), sources={"base": str(npz)}, image_size=64, model=model,
        train={"rounds": rounds, "local_epochs": local_epochs, "batch_size": 50, "lr": 0.01, "weight_decay": 0.001,
               "lr_decay": 0.998, "grad_clip": 10.0, "aggregation": "uniform"},
        clients_per_round=per_round, device="cpu", threads=threads, backend=backend, eval_every=rounds, log_every=rounds,
    )


def plain_loop(spec: RunSpec) -> tuple[dict[str, np.ndarray], float]:
    """The same federated training as a bare loop: no messages, no checkpoints, no files."""
    _task_cached.cache_clear()  # both sides load their data and build their caches themselves
    t0 = time.perf_counter()
    spec = fed.resolve_data_shapes(spec)
    task = task_for(spec)
    cfg = spec.train_config()
    federation = fed.Federation(spec, log=lambda m: None)  # only for its sampling and step budgets
    fed.seed_everything(spec.seed)
    model = fed.new_model(spec)
    global_arrays = model_arrays(model)
    for rnd in range(1, cfg.rounds + 1):
        updates = []
        for pid in federation.sample(rnd):
            load_arrays(model, global_arrays)
            data = task.client_data(pid)
            local_sgd(model, data.train_x, data.train_y, federation.steps(pid), cfg, rnd, torch.device("cpu"),
                      fed.client_generator(spec.seed, rnd, pid))
            updates.append(model_arrays(model))
        # uniform weights normalised as FedAvg's server does (w / w.sum()), so the sums match bit for bit
        global_arrays = weighted_average(updates, list(np.ones(len(updates)) / len(updates)))
    load_arrays(model, global_arrays)
    task.evaluate_global(model, torch.device("cpu"))
    return global_arrays, time.perf_counter() - t0


def through_engine(spec: RunSpec) -> tuple[dict[str, np.ndarray], float]:
    _task_cached.cache_clear()
    shutil.rmtree(spec.run_dir, ignore_errors=True)  # a fresh run, never a resume
    t0 = time.perf_counter()
    engine.run(spec, log=lambda m: None)
    elapsed = time.perf_counter() - t0
    final = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    return {k: v.numpy() for k, v in final.items()}, elapsed


def measure(model: str, clients: int, per_round: int, rounds: int, threads: int, backend: str, workdir: Path,
            local_epochs: float = 5, repeats: int = 2) -> dict:
    npz, part = make_data(workdir, clients)
    spec = make_spec(workdir, npz, part, model, rounds, per_round, threads, backend, local_epochs)
    # warm-up: imports, first model build, data loading (both sides then find them cached)
    warm = make_spec(workdir, npz, part, model, 1, min(per_round, 2), threads, backend, local_epochs)
    warm.run_dir = str(workdir / "warmup")
    engine.run(warm, log=lambda m: None)
    # alternate the two sides and keep each side's best time (order and warm-up effects cancel)
    plain_times, engine_times = [], []
    for _ in range(repeats):
        engine_arrays, t = through_engine(spec)
        engine_times.append(t)
        plain_arrays, t = plain_loop(spec)
        plain_times.append(t)
    plain_s, engine_s = min(plain_times), min(engine_times)
    identical = plain_arrays.keys() == engine_arrays.keys() and all(
        np.array_equal(plain_arrays[k], engine_arrays[k]) for k in plain_arrays)
    return {"bench": "engine_overhead", "model": model, "backend": backend, "clients": clients, "per_round": per_round,
            "rounds": rounds, "local_epochs": local_epochs,
            "threads": threads, "plain_s": round(plain_s, 2), "engine_s": round(engine_s, 2),
            "ratio": round(engine_s / plain_s, 3), "repeats": repeats, "identical_weights": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-epochs", type=float, default=5)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per side; the best of each counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="inline", choices=engine.BACKENDS)
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    limit_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fmb-bench-") as tmp:
        row = measure(args.model, args.clients, args.per_round, args.rounds, args.threads, args.backend, Path(tmp),
                      args.local_epochs, args.repeats)
    emit([row], args.out)
    if not row["identical_weights"]:
        sys.exit("engine and plain loop ended with different weights: the comparison is not like for like")


if __name__ == "__main__":
    main()
