"""Seeds side by side in one process (``train.seeds_together``) against the same runs one after another, on a
host-bound round: a job's seconds a round and the runs' final weights.

The earlystop paper job (its train block, 100 DermaMNIST clients at the official split sizes, Dirichlet 0.1, 10
a round, evaluation every round) with its clients together (``train.batch_clients``), on the engine's GPU path run
on the CPU (device arrays, device-cached client data: ``host_overhead.py``), on a thin ConvNeXtV2-nano (stage
widths ``--width``, ``--image-size`` px): the arithmetic is small, so a round's time is mostly what it costs the
host to launch its ops, as on a GPU. N seeds are timed alone, one after another, then side by side
(``fl/engine/runs_together.py``); a job's seconds a round side by side are the round's wall time over N. The runs' final
weights side by side are checked against alone (float32 rounding of the stacked sums). The ATen ops of a steady
round a job (a launch each or more on a GPU; R rounds' count less R - 1's, over the runs) are counted both ways:
on a CPU each op computes as it is dispatched, so the seconds show little, the ops what a GPU launches.

    python bench/seeds_side_by_side.py [--seeds 3] [--rounds 4] [--width 8] [--image-size 32] [--out bench/results.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import engine_overhead as eo  # noqa: E402
import host_overhead as ho  # noqa: E402
from _report import emit, git_head  # noqa: E402
from _timing import steady_s_per_round, time_spec, time_specs_together  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402

#: largest difference allowed between a run's final weights side by side and alone (float32 rounding)
ATOL = 1e-4


def max_weight_difference(a: Path, b: Path) -> float:
    import torch

    wa, wb = (torch.load(Path(d) / "model.pt", weights_only=True) for d in (a, b))
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


class _Ops:
    """ATen ops (not views) dispatched in every thread that runs a job through ``engine.run`` (a dispatch mode is
    per thread: each run's thread enters its own, all adding to one count)."""

    def __init__(self) -> None:
        self.n = 0

    def __enter__(self) -> _Ops:
        from torch.utils._python_dispatch import TorchDispatchMode

        from fedmedbench.fl.engine import flower as engine

        counter, run = self, engine.run

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.n += not func.is_view
                return func(*args, **(kwargs or {}))

        def counted(*a, **kw):
            with Mode():
                return run(*a, **kw)

        self._undo = ho._patch(engine, "run", counted)
        return self

    def __exit__(self, *exc) -> None:
        self._undo()


def ops_of(runner, specs) -> int:
    with _Ops() as ops:
        runner(specs)
    return ops.n


def steady_ops_per_job_round(specs: list, together: bool) -> float:
    """The ATen ops of one steady round of each run (those of R rounds less those of R - 1), per run."""
    rounds = specs[0].train["rounds"]
    fewer = [dataclasses.replace(s, run_dir=f"{s.run_dir}-fewer", train={**s.train, "rounds": rounds - 1}) for s in specs]
    if together:
        def runner(group):
            return time_specs_together(group)
    else:
        def runner(group):
            return [time_spec(s) for s in group]
    return (ops_of(runner, specs) - ops_of(runner, fewer)) / len(specs)


def measure(seeds: int, rounds: int, width: int, image_size: int, threads: int, workdir: Path) -> dict:
    config = ROOT / "config" / "studies" / "earlystop.yaml"
    npz, part = eo.make_data(workdir, 100, image_size=image_size)
    train, model = eo.study_train(config, "earlystop")
    train = {**train, "batch_clients": True}
    base = eo.make_spec(workdir, npz, part, model, rounds, 10, threads, "inline", 5, "cpu", 1, train, image_size)
    alone = [dataclasses.replace(base, seed=s, run_dir=f"{workdir}/alone-{s}") for s in range(seeds)]
    side = [dataclasses.replace(base, seed=s, run_dir=f"{workdir}/side-{s}") for s in range(seeds)]
    undo = [ho.as_on_a_gpu(), ho.thin_timm(width)]
    try:
        alone_s = [steady_s_per_round(time_spec(s)) for s in alone]
        side_s = steady_s_per_round(time_specs_together(side)) / seeds
        ops_alone = steady_ops_per_job_round(alone[:1], together=False)
        ops_side = steady_ops_per_job_round([dataclasses.replace(s, run_dir=f"{s.run_dir}-ops") for s in side], True)
    finally:
        for u in reversed(undo):
            u()
    diff = max(max_weight_difference(a.run_dir, b.run_dir) for a, b in zip(alone, side, strict=True))
    if diff > ATOL:
        raise SystemExit(f"seeds_side_by_side: a run side by side ends {diff:.3g} from the run alone (> {ATOL})")
    mean_alone = sum(alone_s) / len(alone_s)
    return {"bench": "seeds_side_by_side", "code": git_head(), "device": "cpu", "seeds": seeds, "rounds": rounds,
            "width": width, "image_size": image_size, "threads": threads,
            "alone_s_per_round": round(mean_alone, 4), "side_by_side_s_per_job_round": round(side_s, 4),
            "speedup": round(mean_alone / side_s, 3), "max_weight_difference": diff,
            "ops_per_job_round_alone": round(ops_alone), "ops_per_job_round_side_by_side": round(ops_side)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4, help="rounds a run (the first is left out)")
    ap.add_argument("--width", type=int, default=8, help="first stage width of the thin ConvNeXtV2-nano")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    if args.seeds < 2 or args.rounds < 2:
        raise SystemExit("seeds_side_by_side: give --seeds 2 or more and --rounds 2 or more")
    if min(args.width, args.image_size, args.threads) < 1:  # a 0-wide model or image fails deep in the model build
        raise SystemExit("seeds_side_by_side: give --width, --image-size and --threads of 1 or more")
    limit_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fmb-seeds-") as tmp:
        row = measure(args.seeds, args.rounds, args.width, args.image_size, args.threads, Path(tmp))
    emit([row], args.out)
    print(f"alone {row['alone_s_per_round']} s a round; side by side {row['side_by_side_s_per_job_round']} s a job-round "
          f"({row['speedup']}x); weights within {row['max_weight_difference']:.2g}")
    print(f"ATen ops a job-round: alone {row['ops_per_job_round_alone']}, side by side "
          f"{row['ops_per_job_round_side_by_side']}")


if __name__ == "__main__":
    main()
