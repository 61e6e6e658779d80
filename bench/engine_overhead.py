"""Engine overhead: N FedAvg rounds through the pipeline's Flower engine vs plain PyTorch loops.

All sides do the same work in one process with the same threads: the same initial model
(seeded), the same sampled clients per round (seeded by (seed, round)), the same local
SGD steps from the same per-(seed, round, client) batch generators, uniform averaging,
and the same evaluations (global test/validation sets and every client's test split).
The sides:

* ``engine``: ``fl.engine.run`` (Flower messages, per-client state store, per-round
  checkpoints, metric rows, output files);
* ``plain``: a bare loop that, like the engine, hands NumPy arrays between server and clients;
* ``resident`` (``--resident``, always with ``--device cuda``): data and model stay on the
  device, averaging on the device (float64, the engine's order) -- the floor a round can reach.

On CPU the final weights must be bit-identical (checked), so the ratio of wall times is the
cost of everything the engine adds. On a GPU, kernels are not bit-reproducible across sides;
the largest difference is reported instead.

    python bench/engine_overhead.py --model cnn_small --clients 100 --per-round 10 --rounds 5
    python bench/engine_overhead.py --device cuda --model timm:convnextv2_nano --rounds 10 --eval-every 1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import above_zero, check_cuda, positive  # noqa: E402
from _report import emit  # noqa: E402
from _timing import waiting_steps  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.fl.api import TrainConfig  # noqa: E402
from fedmedbench.fl.api.arrays import load_arrays, model_arrays, weighted_average  # noqa: E402
from fedmedbench.fl.determinism import use_deterministic_kernels  # noqa: E402
from fedmedbench.fl.engine import federation as fed  # noqa: E402
from fedmedbench.fl.engine import flower as engine  # noqa: E402
from fedmedbench.fl.spec import RunSpec  # noqa: E402
from fedmedbench.fl.tasks.base import _task_cached, task_for  # noqa: E402
from fedmedbench.fl.training import local_sgd  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402

#: DermaMNIST's official split sizes (the earlystop study's per-round work at 64 px)
DERMA_COUNTS = {"train": 7007, "val": 1003, "test": 2005}


def make_data(workdir: Path, clients: int, seed: int = 0, image_size: int = 64) -> tuple[Path, Path]:
    arrays = synthetic.generate("dermamnist", image_size, seed=seed, counts=DERMA_COUNTS)
    npz = workdir / f"dermamnist_{image_size}.npz"
    io.write_npz(npz, arrays)
    labels = {s: arrays[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")}
    part = workdir / "partition.json"
    io.write_json(part, P.build_partition(labels, "fls", clients, seed, {"alpha": 0.1}, num_classes=7))
    return npz, part


#: the local training of the bench's default workload (the earlystop study's, at batch 50)
DEFAULT_TRAIN = {"batch_size": 50, "lr": 0.01, "weight_decay": 0.001, "lr_decay": 0.998, "grad_clip": 10.0,
                 "aggregation": "uniform"}


def study_train(config: Path, study: str) -> tuple[dict, str]:
    """A study's own ``train`` block and model name (``--study-config``), e.g. the earlystop paper grid's
    batch 256, momentum 0.9, lr 1e-3 and double input normalisation; rounds and epochs come from the bench."""
    import yaml

    if not Path(config).is_file():
        raise SystemExit(f"{config}: no such study config")
    studies = (yaml.safe_load(Path(config).read_text()) or {}).get("studies") or {}
    if study not in studies:
        raise SystemExit(f"{config}: no study {study!r} (its studies: {', '.join(studies) or 'none'})")
    st = studies[study]
    train = {k: v for k, v in st["train"].items() if k not in ("rounds", "local_epochs")}
    return train, st["model"]["name"]


def make_spec(workdir: Path, npz: Path, part: Path, model: str, rounds: int, per_round: int, threads: int, backend: str,
              local_epochs: float = 5, device: str = "cpu", eval_every: int | None = None,
              train: dict | None = None, image_size: int = 64) -> RunSpec:
    return RunSpec(
        run_dir=str(workdir / f"run-{model}-{backend}"), study="bench", dataset="dermamnist", setting="dir0.1",
        method="fedavg", seed=0, partition_path=str(part), sources={"base": str(npz)}, image_size=image_size, model=model,
        train={**(train or DEFAULT_TRAIN), "rounds": rounds, "local_epochs": local_epochs},
        clients_per_round=per_round, device=device, threads=threads, backend=backend, eval_every=eval_every or rounds,
        log_every=rounds,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_eval_round(spec: RunSpec, rnd: int, rounds: int) -> bool:
    return rnd % max(1, spec.eval_every) == 0 or rnd == rounds


def _loop_setup(spec: RunSpec):
    """What both bare loops start from: the resolved spec, its task, train config and a Federation
    (only for its sampling and step budgets), with the run's seed set."""
    spec = fed.resolve_data_shapes(spec)
    task = task_for(spec)
    federation = fed.Federation(spec, log=lambda m: None)
    fed.seed_everything(spec.seed)
    return spec, task, TrainConfig.from_spec(spec), federation


def plain_loop(spec: RunSpec) -> tuple[dict[str, np.ndarray], float]:
    """The same federated training as a bare loop: no messages, no checkpoints, no files."""
    _task_cached.cache_clear()  # both sides load their data and build their caches themselves
    device = torch.device(spec.device)
    _sync(device)
    t0 = time.perf_counter()
    spec, task, cfg, federation = _loop_setup(spec)
    model = fed.new_model(spec)
    global_arrays = model_arrays(model)
    model.to(device)
    ends: list[float] = []
    for rnd in range(1, cfg.rounds + 1):
        updates = []
        for pid in federation.sample(rnd):
            load_arrays(model, global_arrays)
            data = task.client_data(pid)
            local_sgd(model, data.train_x, data.train_y, federation.steps(pid), cfg, rnd, device,
                      fed.client_generator(spec.seed, rnd, pid))
            updates.append(model_arrays(model))
        # uniform weights normalised as FedAvg's server does (w / w.sum()), so the sums match bit for bit
        global_arrays = weighted_average(updates, list(np.ones(len(updates)) / len(updates)))
        if _is_eval_round(spec, rnd, cfg.rounds):
            load_arrays(model, global_arrays)
            task.evaluate_global(model, device)
        _sync(device)
        ends.append(time.perf_counter() - t0)
    return global_arrays, time.perf_counter() - t0, _round_times(ends)


def resident_loop(spec: RunSpec) -> tuple[dict[str, np.ndarray], float]:
    """The floor: data and model stay on the device, the average is taken there (float64, FedAvg's order)."""
    _task_cached.cache_clear()
    device = torch.device(spec.device)
    _sync(device)
    t0 = time.perf_counter()
    spec, task, cfg, federation = _loop_setup(spec)
    model = fed.new_model(spec).to(device)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    on_device: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    ends: list[float] = []
    for rnd in range(1, cfg.rounds + 1):
        sampled = federation.sample(rnd)
        w = np.ones(len(sampled)) / len(sampled)
        acc = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        for wi, pid in zip(w, sampled, strict=True):
            model.load_state_dict(global_state)
            if pid not in on_device:
                data = task.client_data(pid)
                on_device[pid] = (data.train_x.to(device), data.train_y.to(device))
            x, y = on_device[pid]
            local_sgd(model, x, y, federation.steps(pid), cfg, rnd, device, fed.client_generator(spec.seed, rnd, pid))
            for k, v in model.state_dict().items():
                acc[k] += float(wi) * v.double()
        global_state = {k: (acc[k].round() if not v.is_floating_point() else acc[k]).to(v.dtype)
                        for k, v in global_state.items()}
        if _is_eval_round(spec, rnd, cfg.rounds):
            model.load_state_dict(global_state)
            task.evaluate_global(model, device)
        _sync(device)
        ends.append(time.perf_counter() - t0)
    return {k: v.cpu().numpy() for k, v in global_state.items()}, time.perf_counter() - t0, _round_times(ends)


def _round_times(ends: list[float]) -> list[float]:
    """Seconds of each round from the times its rounds ended (the first includes the side's set-up)."""
    return list(np.diff([0.0, *ends]))


def through_engine(spec: RunSpec) -> tuple[dict[str, np.ndarray], float]:
    _task_cached.cache_clear()
    shutil.rmtree(spec.run_dir, ignore_errors=True)  # a fresh run, never a resume
    device = torch.device(spec.device)
    _sync(device)
    t0 = time.perf_counter()
    engine.run(spec, log=lambda m: None)
    _sync(device)
    elapsed = time.perf_counter() - t0
    final = torch.load(Path(spec.run_dir) / "model.pt", weights_only=True)
    import pandas as pd

    # the federation's own clock per round (a round's checkpoint write falls in the next round's time)
    ends = pd.read_csv(Path(spec.run_dir) / "metrics.csv")["elapsed_s"].tolist()
    return {k: v.numpy() for k, v in final.items()}, elapsed, _round_times(ends)


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)), initial=0.0)) for k in a)


def profile_engine(spec: RunSpec, path: Path, top: int = 45) -> None:
    """One more engine run under cProfile; the top functions by total and cumulative time go to ``path``."""
    import cProfile
    import io as _io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    through_engine(spec)
    prof.disable()
    out = _io.StringIO()
    for order in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=out).sort_stats(order).print_stats(top)
    io.write_text(path, out.getvalue())  # temp file, then rename: no half-written profile


def torch_profile_engine(spec: RunSpec, path: Path, top: int = 45) -> None:
    """One more engine run under ``torch.profiler`` (host, and the GPU when the run is on one): ops and
    CUDA runtime calls (copies, synchronisations) by their own host time and, on a GPU, by device time.
    Where cProfile sees Python functions, this sees what each costs in launches and waits."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = spec.device == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as prof:
        through_engine(spec)
    averages = prof.key_averages()
    tables = [averages.table(sort_by="self_cpu_time_total", row_limit=top)]
    if on_gpu:
        tables.append(averages.table(sort_by="self_device_time_total", row_limit=top))
    io.write_text(path, "\n\n".join(tables))  # temp file, then rename: no half-written profile


def measure(model: str, clients: int, per_round: int, rounds: int, threads: int, backend: str, workdir: Path,
            local_epochs: float = 5, repeats: int = 2, device: str = "cpu", resident: bool = False,
            eval_every: int | None = None, train: dict | None = None, profile: Path | None = None,
            torch_profile: Path | None = None) -> dict:
    npz, part = make_data(workdir, clients)
    spec = make_spec(workdir, npz, part, model, rounds, per_round, threads, backend, local_epochs, device, eval_every,
                     train)
    # warm-up: imports, first model build, data loading, device kernels (all sides then find them cached)
    warm = make_spec(workdir, npz, part, model, 1, min(per_round, 2), threads, backend, local_epochs, device, train=train)
    warm.run_dir = str(workdir / "warmup")
    engine.run(warm, log=lambda m: None)
    sides = {"engine": through_engine, "plain": plain_loop}
    if resident or device == "cuda":
        sides["resident"] = resident_loop
    # alternate the sides and keep each side's best time (order and warm-up effects cancel)
    times: dict[str, list[float]] = {name: [] for name in sides}
    steady: dict[str, list[float]] = {name: [] for name in sides}  # mean s/round after the first round
    finals: dict[str, dict[str, np.ndarray]] = {}
    for _ in range(repeats):
        for name, side in sides.items():
            finals[name], t, round_times = side(spec)
            times[name].append(t)
            steady[name].append(float(np.mean(round_times[1:] if len(round_times) > 1 else round_times)))
    if profile is not None:
        profile_engine(spec, profile)
    if torch_profile is not None:
        torch_profile_engine(spec, torch_profile)
    best = {name: min(ts) for name, ts in times.items()}
    ref = finals["engine"]
    identical = {name: ref.keys() == arr.keys() and all(np.array_equal(ref[k], arr[k]) for k in ref)
                 for name, arr in finals.items() if name != "engine"}
    row = {"bench": "engine_overhead", "model": model, "backend": backend, "device": device, "clients": clients,
           "per_round": per_round, "rounds": rounds, "local_epochs": local_epochs, "eval_every": spec.eval_every,
           "batch_size": spec.train["batch_size"], "threads": threads, "plain_s": round(best["plain"], 2), "engine_s": round(best["engine"], 2),
           "ratio": round(best["engine"] / best["plain"], 3), "repeats": repeats,
           "identical_weights": identical["plain"], "times": {k: [round(t, 2) for t in v] for k, v in times.items()}}
    row["steady_s_per_round"] = {k: round(min(v), 3) for k, v in steady.items()}
    row["steady_ratio"] = round(min(steady["engine"]) / min(steady["plain"]), 3)
    if "resident" in best:
        row.update(resident_s=round(best["resident"], 2), ratio_resident=round(best["engine"] / best["resident"], 3),
                   identical_resident=identical["resident"],
                   s_per_round={k: round(v / rounds, 3) for k, v in best.items()},
                   steady_ratio_resident=round(min(steady["engine"]) / min(steady["resident"]), 3))
    if device != "cpu":
        row["max_abs_difference"] = {name: _max_difference(ref, arr) for name, arr in finals.items() if name != "engine"}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="the model of every side (default cnn_small; with --study-config, the study's)")
    ap.add_argument("--clients", type=positive, default=100)
    ap.add_argument("--per-round", type=positive, default=10)
    ap.add_argument("--rounds", type=positive, default=5)
    ap.add_argument("--local-epochs", type=above_zero, default=5)
    ap.add_argument("--repeats", type=positive, default=2, help="alternating runs per side; the best of each counts")
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--backend", default="inline", choices=engine.BACKENDS)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--resident", action="store_true", help="also time the device-resident loop (always on cuda)")
    ap.add_argument("--eval-every", type=positive, help="evaluate every N rounds on every side (default: last round only)")
    ap.add_argument("--study-config", type=Path,
                    help="take local training (batch, lr, momentum, ...) and the model from this study config")
    ap.add_argument("--study", help="the study of --study-config (default earlystop)")
    ap.add_argument("--profile", type=Path, help="profile one more engine run (cProfile) into this file")
    ap.add_argument("--torch-profile", type=Path,
                    help="profile one more engine run with torch.profiler (ops, copies, syncs) into this file")
    ap.add_argument("--compile", action="store_true", help="train.compile on every side (torch.compile'd forward)")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic kernels on every side (engine.deterministic): what reproducible GPU runs cost")
    ap.add_argument("--waiting-steps", action="store_true",
                    help="every side's local steps wait for the device as before (CPU batch indices into device data)")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    limit_threads(args.threads)
    check_cuda("engine_overhead", args.device)
    if args.per_round > args.clients:  # else the federation stops every side in a traceback, the data made
        sys.exit(f"engine_overhead: --per-round {args.per_round}: more than --clients {args.clients}")
    if args.waiting_steps and args.device == "cpu":  # batch indices already live where a CPU's data is
        sys.exit("engine_overhead: --waiting-steps changes only how steps wait for a GPU: give --device cuda")
    if args.deterministic:
        use_deterministic_kernels()  # before the first kernel: cuBLAS reads its workspace setting once
    if args.study_config and args.model:
        sys.exit("engine_overhead: --model with --study-config: the model is the study's (give one of them)")
    if args.study and not args.study_config:
        sys.exit("engine_overhead: --study names a study of --study-config, and none is given")
    args.study = args.study or "earlystop"
    train, model = None, args.model or "cnn_small"
    if args.study_config:
        train, model = study_train(args.study_config, args.study)
    if args.compile:
        train = {**(train or DEFAULT_TRAIN), "compile": True}
    with tempfile.TemporaryDirectory(prefix="fmb-bench-") as tmp, (waiting_steps() if args.waiting_steps else nullcontext()):
        row = measure(model, args.clients, args.per_round, args.rounds, args.threads, args.backend, Path(tmp),
                      args.local_epochs, args.repeats, args.device, args.resident, args.eval_every, train, args.profile,
                      args.torch_profile)
    if args.study_config:
        row["study_config"] = f"{args.study_config}:{args.study}"
    row["compile"] = args.compile
    row["deterministic"] = args.deterministic
    row["waiting_steps"] = args.waiting_steps
    emit([row], args.out)
    if args.device == "cpu" and not row["identical_weights"]:
        sys.exit("engine and plain loop ended with different weights: the comparison is not like for like")


if __name__ == "__main__":
    main()
