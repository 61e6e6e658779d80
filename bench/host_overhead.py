"""What the engine adds to a round that a GPU would wait on, measured on the CPU.

On a GPU the earlystop paper configuration is launch-bound: the device finishes each kernel before
Python has queued the next, so a round takes as long as its host work. Two things the engine adds
to that host work can be measured without a GPU, on the same workload as ``engine_overhead.py
--study-config`` (ConvNeXtV2-nano, DermaMNIST-sized synthetic data at 64 px, 100 clients, 10 per
round, evaluation every round, the study's batch 256), the engine against that bench's GPU-resident
loop:

* **ATen ops** per round (non-view ops, each one or more kernel launches on a GPU), counted with a
  ``TorchDispatchMode`` and split into local training, evaluation and the rest (the model's arrays
  between server and clients, averaging, metric rows, the data-free rule, the checkpoint's
  snapshot). Ops in the checkpoint's background thread are not counted (dispatch modes are
  per thread); they are serialisation and file writes, not kernels.
* **host seconds** per round outside local training and evaluation, with the model's structure at a
  thin width (``--width``, default 8: stage widths 8, 16, 32, 64 for the real 80 ... 640; the same 160
  tensors) so that copying and averaging the arrays costs almost nothing on the CPU, as on a GPU;
  steady rounds (2 .. R), best of ``--repeats`` alternating runs.

The engine runs as it does on a GPU with the inline backend: device arrays and device-cached client
data on (here on the CPU, as ``tests/test_device_arrays.py`` runs them). Both sides end with the same
weights, bit for bit (checked).

With ``--device cuda`` the same split is timed on the GPU itself, with the real model (``--width 0``):
local training ends with its one loss read and evaluation with its copy of the predictions to the
host, so the device is idle at both boundaries and the seconds outside them are the engine's own.

    python bench/host_overhead.py --rounds 6 --repeats 2
    python bench/host_overhead.py --width 2 --image-size 32 --threads 1 --rounds 6 --repeats 2
    python bench/host_overhead.py --device cuda --width 0 --rounds 6 --repeats 2 --threads 4

It also reports whole steady rounds per side (``s_per_round``: round, local training, evaluation) and
their ratio. With the second command every op is tiny, so the CPU round is bound by host work as a GPU
round is: what the engine adds there, device-specific costs aside. ``--checkpoint-writes in-round``
writes the engine's checkpoints in the round instead of in the background thread, to see what that
thread costs a host-bound round.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_overhead as eo  # noqa: E402
from _cli import above_zero, check_cuda, positive  # noqa: E402
from _report import emit, git_head  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.engine import federation as fed  # noqa: E402
from fedmedbench.fl.engine import job as job_module  # noqa: E402
from fedmedbench.fl.methods import _sgd, _together  # noqa: E402
from fedmedbench.fl.tasks.classification import ClassificationTask  # noqa: E402

PHASES = ("train", "eval", "other")
#: ConvNeXtV2-nano's stage widths (timm ``convnextv2_nano``)
NANO_DIMS = (80, 160, 320, 640)


class Phases:
    """Which phase the main thread is in (``other`` outside any wrapped call), the seconds spent in each
    wrapped phase, and (while counting) the non-view ATen ops dispatched in each phase."""

    def __init__(self) -> None:
        self.stack = ["other"]
        self.intervals: list[tuple[float, float, str]] = []
        self.ops: collections.Counter[str] = collections.Counter()
        self.other_ops: collections.Counter[str] = collections.Counter()
        #: the op counts when each round ended (the difference of two is the ops of the rounds between)
        self.marks: list[tuple[collections.Counter[str], collections.Counter[str]]] = []

    def round_ended(self, round_ends: list[float]) -> None:
        round_ends.append(time.perf_counter())
        self.marks.append((self.ops.copy(), self.other_ops.copy()))

    def steady_ops(self, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
        """Mean ops per round over rounds 2 .. R, per phase and (outside training and evaluation) per op."""
        (ops0, other0), (ops1, other1) = self.marks[-rounds], self.marks[-1]
        n = rounds - 1
        return ({p: (ops1[p] - ops0[p]) / n for p in PHASES},
                {k: v / n for k, v in (other1 - other0).most_common()})

    def wrap(self, name: str, fn: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            outer = self.stack[-1] != "other"  # a phase inside a phase counts once, as the outer one
            self.stack.append(self.stack[-1] if outer else name)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if not outer:
                    self.intervals.append((t0, time.perf_counter(), name))
                self.stack.pop()
        wrapped.__wrapped__ = fn
        return wrapped

    def in_phase(self, start: float, end: float, name: str | None = None) -> float:
        """Seconds of wrapped phases (of the phase ``name`` only, if given) that fall within [start, end]."""
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b, p in self.intervals if name in (None, p))


class CountOps(TorchDispatchMode):
    def __init__(self, phases: Phases) -> None:
        super().__init__()
        self.phases = phases

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            phase = self.phases.stack[-1]
            self.phases.ops[phase] += 1
            if phase == "other":
                self.phases.other_ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _patch(target, name: str, new) -> Callable[[], None]:
    old = getattr(target, name)
    setattr(target, name, new)
    return lambda: setattr(target, name, old)


def instrument(phases: Phases, round_ends: list[float], side: str) -> Callable[[], None]:
    """Wrap local training (the engine's ``local_loop`` or ``train_together``, the resident loop's ``local_sgd``) and the
    server's evaluation as phases, and record when each round of ``side`` ends. Returns the undo."""
    undo = [
        _patch(_sgd, "local_loop", phases.wrap("train", _sgd.local_loop)),
        _patch(eo, "local_sgd", phases.wrap("train", eo.local_sgd)),
        _patch(_together, "train_together", phases.wrap("train", _together.train_together)),
        _patch(ClassificationTask, "evaluate_global", phases.wrap("eval", ClassificationTask.evaluate_global)),
    ]
    if side == "engine":
        finish = fed.Federation.finish_round

        def finish_round(self, *args, **kwargs):
            out = finish(self, *args, **kwargs)
            phases.round_ended(round_ends)
            return out

        undo.append(_patch(fed.Federation, "finish_round", finish_round))
    else:
        sync = eo._sync

        def resident_sync(device):  # the resident loop syncs once before its first round and after each round
            sync(device)
            phases.round_ended(round_ends)

        undo.append(_patch(eo, "_sync", resident_sync))
    return lambda: [u() for u in reversed(undo)]


def as_on_a_gpu() -> Callable[[], None]:
    """The engine's GPU path on the CPU: arrays kept as tensors and client data cached where the model is."""
    undo = [_patch(job_module, "ARRAY_DEVICE_TYPES", ("cuda", "cpu")),
            _patch(job_module, "CACHED_DEVICE_TYPES", ("cuda", "cpu")),
            _patch(job_module, "free_device_memory", lambda device: 1 << 40)]
    return lambda: [u() for u in reversed(undo)]


def checkpoint_writes_in_the_round() -> Callable[[], None]:
    """The engine's checkpoint written in the round, as before ``checkpoint.BackgroundWriter``: what the
    background thread's serialisation and writes cost a host-bound round shows as the difference."""
    from fedmedbench.fl.state import checkpoint

    def submit(self, fn, *args) -> None:
        self.wait()
        fn(*args)

    return _patch(checkpoint.BackgroundWriter, "submit", submit)


def thin_timm(width: int | None) -> Callable[[], None]:
    """``timm.create_model('convnextv2_nano')`` at stage widths (w, 2w, 4w, 8w); ``None`` keeps the real model."""
    import timm

    create = timm.create_model
    if width is None:
        return lambda: None

    def create_model(name, *args, **kwargs):
        if name == "convnextv2_nano":
            kwargs.setdefault("dims", tuple(width * m for m in (1, 2, 4, 8)))
        return create(name, *args, **kwargs)

    return _patch(timm, "create_model", create_model)


def steady_host_seconds(phases: Phases, round_ends: list[float], rounds: int) -> list[float]:
    """Rounds 2 .. R: wall seconds minus the seconds spent in local training and evaluation. A round
    ends where the last one's does (round 1 of the engine has its set-up in it, so it is left out)."""
    ends = round_ends[-rounds:]
    return [b - a - phases.in_phase(a, b) for a, b in zip(ends, ends[1:], strict=False)]


def steady_phase_seconds(phases: Phases, round_ends: list[float], rounds: int) -> dict[str, float]:
    """Mean seconds per round over rounds 2 .. R: the whole round, its local training and its evaluation."""
    start, end = round_ends[-rounds], round_ends[-1]
    n = rounds - 1
    return {"round": (end - start) / n, **{p: phases.in_phase(start, end, p) / n for p in ("train", "eval")}}


def side_run(side: str, spec, count: bool) -> tuple[dict[str, np.ndarray], Phases, list[float]]:
    phases, round_ends = Phases(), []
    undo = instrument(phases, round_ends, side)
    try:
        run = eo.through_engine if side == "engine" else eo.resident_loop
        if count:
            with CountOps(phases):
                final, _, _ = run(spec)
        else:
            final, _, _ = run(spec)
    finally:
        undo()
    return final, phases, round_ends


def measure(rounds: int, repeats: int, width: int | None, threads: int, local_epochs: float, workdir: Path,
            config: Path, device: str = "cpu", clients: int = 100, per_round: int = 10, image_size: int = 64) -> dict:
    npz, part = eo.make_data(workdir, clients, image_size=image_size)
    train, model = eo.study_train(config, "earlystop")
    spec = eo.make_spec(workdir, npz, part, model, rounds, per_round, threads, "inline", local_epochs, device, 1, train,
                        image_size)
    warm = eo.make_spec(workdir, npz, part, model, 1, 2, threads, "inline", local_epochs, device, 1, train, image_size)
    warm.run_dir = str(workdir / "warmup")
    eo.through_engine(warm)
    host: dict[str, list[float]] = {"engine": [], "resident": []}
    whole: dict[str, list[dict[str, float]]] = {"engine": [], "resident": []}
    finals = {}
    for _ in range(repeats):
        for side in host:
            finals[side], phases, ends = side_run(side, spec, count=False)
            host[side].append(float(np.mean(steady_host_seconds(phases, ends, rounds))))
            whole[side].append(steady_phase_seconds(phases, ends, rounds))
    ops = {}
    for side in host:
        _, phases, _ = side_run(side, spec, count=True)
        per_phase, other = phases.steady_ops(rounds)
        if not (per_phase["train"] and per_phase["eval"]):  # a renamed function would silently count as "other"
            raise RuntimeError(f"{side}: no ops counted in local training or evaluation ({per_phase}); "
                               "the functions this bench wraps were not called")
        ops[side] = {p: round(n) for p, n in per_phase.items()}
        ops[side]["other_top"] = {k: round(n) for k, n in list(other.items())[:8]}
    identical = finals["engine"].keys() == finals["resident"].keys() and all(
        np.array_equal(finals["engine"][k], finals["resident"][k]) for k in finals["engine"])
    best = {side: min(v) for side, v in host.items()}
    fastest = {side: min(v, key=lambda r: r["round"]) for side, v in whole.items()}
    return {"bench": "host_overhead", "code": git_head(), "device": device, "model": model, "width": width or NANO_DIMS[0],
            "image_size": image_size, "clients": clients, "per_round": per_round, "rounds": rounds, "local_epochs": local_epochs,
            "batch_size": spec.train["batch_size"], "threads": threads, "repeats": repeats,
            "ops_per_round": ops, "host_s_per_round": {k: round(v, 4) for k, v in best.items()},
            "host_runs": {k: [round(t, 4) for t in v] for k, v in host.items()},
            "engine_minus_resident_ms_per_client": round((best["engine"] - best["resident"]) / per_round * 1e3, 2),
            # whole steady rounds (the run with the shorter rounds per side): where every op is tiny (a thin
            # model, small images, one thread) the CPU round is bound by host work, as a GPU's is
            "s_per_round": {side: {k: round(v, 4) for k, v in r.items()} for side, r in fastest.items()},
            "round_ratio": round(fastest["engine"]["round"] / fastest["resident"]["round"], 4),
            "identical_weights": identical,
            "max_abs_difference": eo._max_difference(finals["engine"], finals["resident"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="rounds per run (at least 2: round 1 holds the set-up)")
    ap.add_argument("--repeats", type=positive, default=2, help="alternating timed runs per side; the best counts")
    ap.add_argument("--width", type=int, default=8, help="first stage width of the thin model (0: the real one)")
    ap.add_argument("--local-epochs", type=above_zero, default=5)
    ap.add_argument("--image-size", type=positive, default=64,
                    help="synthetic DermaMNIST's side in pixels (32 with --width 2 --threads 1: every op tiny, the "
                         "round host-bound as on a GPU)")
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the engine's real GPU path, timed on the GPU (use --width 0 for the real model)")
    ap.add_argument("--study-config", type=Path, default=Path(__file__).resolve().parents[1] / "config/studies/earlystop.yaml")
    ap.add_argument("--checkpoint-writes", choices=["background", "in-round"], default="background",
                    help="in-round: the engine writes each checkpoint before the next round starts (to compare)")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (rounds 2 .. R are measured)")
    if args.width < 0:  # a negative stage width fails deep in the model build
        ap.error(f"argument --width: {args.width}: give 0 (the real model) or a width from 1")
    check_cuda("host_overhead", args.device)
    limit_threads(args.threads)
    undo = [as_on_a_gpu() if args.device == "cpu" else (lambda: None), thin_timm(args.width or None),
            checkpoint_writes_in_the_round() if args.checkpoint_writes == "in-round" else (lambda: None)]
    try:
        with tempfile.TemporaryDirectory(prefix="fmb-bench-") as tmp:
            row = measure(args.rounds, args.repeats, args.width or None, args.threads, args.local_epochs, Path(tmp),
                          args.study_config, args.device, image_size=args.image_size)
    finally:
        for u in reversed(undo):
            u()
    row["checkpoint_writes"] = args.checkpoint_writes
    emit([row], args.out)
    if args.device == "cpu" and not row["identical_weights"]:
        sys.exit("engine and resident loop ended with different weights: the comparison is not like for like")


if __name__ == "__main__":
    main()
