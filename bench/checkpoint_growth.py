"""What a round's checkpoint costs as a long run's metric rows pile up.

The earlystop grid evaluates every client's test split every round: 100 client rows per round,
50,000 by round 500. A checkpoint that re-serialises every row so far costs more each round (in
the checkpoint's background thread, holding the GIL the training loop needs); one that appends
only the round's rows (``checkpoint.RowsLog``) costs the same throughout. Two measurements:

* ``--at``: one synchronous ``checkpoint.save`` (serialise, write, fsync) at each given round, with
  that many rounds of rows of the earlystop shape (one server row, 100 client rows per round) and
  the arrays of ``--model``; the rows log, where the code has one, already holds the earlier rounds.
* ``--engine-rounds N``: one engine job of N rounds on the engine-overhead bench's tiny-work
  workload (cnn_small, 100 clients, 10 per round, 1 local epoch, evaluation every round); the
  mean seconds per round of rounds 2-21 against the last 20.

Against an older source tree, run the same script with ``PYTHONPATH=<tree>/src``.

    python bench/checkpoint_growth.py --at 1 100 250 500
    python bench/checkpoint_growth.py --engine-rounds 300
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit, git_head  # noqa: E402

import fedmedbench  # noqa: E402
from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.api.arrays import model_arrays  # noqa: E402
from fedmedbench.fl.state import checkpoint  # noqa: E402
from fedmedbench.metrics.classification import CLASSIFICATION_METRICS  # noqa: E402

#: the columns of an earlystop round (the classification metrics on the global test and validation
#: sets, their client mean/std, 5 local epochs' losses, the data-free rule's fields) and of one client's row
SERVER_KEYS = (["train_loss", *(f"train_loss_e{e}" for e in range(1, 6))]
               + [f"{p}_{m}" for p in ("global", "val", "local_mean", "local_std") for m in CLASSIFICATION_METRICS]
               + ["task_norm", "growth_rate"])
CLIENT_KEYS = [f"local_{m}" for m in CLASSIFICATION_METRICS]


def rows_upto(rounds: int, clients: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    rows = [{"round": r, "clients": 10, **{k: rng.random() for k in SERVER_KEYS}, "saturation": 0, "datafree_stop": 0,
             "elapsed_s": round(r * 2.1, 3)} for r in range(1, rounds + 1)]
    client_rows = [{"round": r, "client": c, **{k: rng.random() for k in CLIENT_KEYS}}
                   for r in range(1, rounds + 1) for c in range(clients)]
    return rows, client_rows


def save_cost(workdir: Path, rounds: list[int], clients: int, model: str, repeats: int) -> list[dict]:
    from fedmedbench.models import build_model

    arrays = model_arrays(build_model(model, 3, 7, 64))
    has_log = hasattr(checkpoint, "RowsLog")
    out = []
    for rnd in rounds:
        times = []
        for rep in range(repeats):
            run_dir = workdir / f"r{rnd}-{rep}"
            rows, client_rows = rows_upto(rnd, clients)
            extra = {}
            if has_log:
                extra["rows_log"] = checkpoint.RowsLog(run_dir)
                if rnd > 1:  # the earlier rounds are in the log already
                    before = checkpoint.RunState(rnd - 1, arrays, rows=rows[:-1], client_rows=client_rows[:-clients])
                    checkpoint.save(run_dir, before, "h", **extra)
            state = checkpoint.RunState(rnd, arrays, rows=rows, client_rows=client_rows)
            t0 = time.perf_counter()
            checkpoint.save(run_dir, state, "h", **extra)
            times.append(time.perf_counter() - t0)
            size = (checkpoint.checkpoint_dir(run_dir) / "server.pt").stat().st_size
        out.append({"round": rnd, "client_rows": rnd * clients, "save_s": round(min(times), 4),
                    "server_pt_mb": round(size / 1e6, 3)})
    return out


def engine_growth(workdir: Path, rounds: int, threads: int) -> dict:
    import engine_overhead as eo

    npz, part = eo.make_data(workdir, 100)
    spec = eo.make_spec(workdir, npz, part, "cnn_small", rounds, 10, threads, "inline", 1, "cpu", 1)
    _, total, per_round = eo.through_engine(spec)
    per_round = np.asarray(per_round)
    return {"engine_s": round(total, 1), "first_s_per_round": round(float(per_round[1:21].mean()), 4),
            "last_s_per_round": round(float(per_round[-20:].mean()), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--at", type=int, nargs="*", default=[1, 100, 250, 500], help="rounds to time one checkpoint at")
    ap.add_argument("--clients", type=int, default=100, help="client rows per round")
    ap.add_argument("--model", default="cnn_small", help="whose arrays the checkpoint holds (timm:convnextv2_nano: 62 MB)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine-rounds", type=int, help="instead: one engine job of this many rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="append the result as JSON lines")
    args = ap.parse_args()
    limit_threads(args.threads)
    code = {"source": str(Path(fedmedbench.__file__).resolve().parent), "commit": git_head(),
            "rows_log": hasattr(checkpoint, "RowsLog")}
    with tempfile.TemporaryDirectory(prefix="fmb-ckpt-") as tmp:
        if args.engine_rounds:
            rows = [{"bench": "checkpoint_growth", "mode": "engine", "rounds": args.engine_rounds, "threads": args.threads,
                     **engine_growth(Path(tmp), args.engine_rounds, args.threads), **code}]
        else:
            rows = [{"bench": "checkpoint_growth", "mode": "save", "model": args.model, **r, **code}
                    for r in save_cost(Path(tmp), sorted(args.at), args.clients, args.model, args.repeats)]
    emit(rows, args.out)


if __name__ == "__main__":
    main()
