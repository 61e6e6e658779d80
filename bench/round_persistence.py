"""What a round's persistence costs: the clients' states and the server checkpoint, per round.

Runs one job through the engine (inline backend) with the paper's model and a method that keeps
a model-sized state per client (SCAFFOLD: its control variate c_i), on data so small that one
local step is all a client trains: what remains of a round is mostly saving and loading client
states and writing the server checkpoint. ``--direct`` writes each client state when the client
saves it (as a Ray actor or a deployed site does) instead of holding it for the round's
checkpoint, the comparison for the in-process default. Against an older source tree, run the
same script with ``PYTHONPATH=<tree>/src``.

    python bench/round_persistence.py --method scaffold --rounds 5
    python bench/round_persistence.py --method scaffold --rounds 5 --direct
    python bench/round_persistence.py --method scaffold --rounds 5 --device cuda   # device arrays on
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit, git_head  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.fl.engine import flower as engine  # noqa: E402
from fedmedbench.fl.spec import RunSpec  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402


def make_data(workdir: Path, clients: int, per_client: int, size: int) -> tuple[Path, Path]:
    counts = {"train": clients * per_client, "val": 2 * per_client, "test": 2 * per_client}
    arrays = synthetic.generate("dermamnist", size, seed=0, counts=counts)
    npz = workdir / "data.npz"
    io.write_npz(npz, arrays)
    labels = {s: arrays[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")}
    part = workdir / "partition.json"
    io.write_json(part, P.build_partition(labels, "iid", clients, 0, {}, num_classes=7))
    return npz, part


def direct_client_states() -> None:
    """Client states written as they are saved: the engine's in-process deferral turned off."""
    from fedmedbench.fl.state import client_state

    class Direct(client_state.ClientStateStore):
        deferred = property(lambda self: False, lambda self, value: None)

    from fedmedbench.fl.state import checkpoint

    checkpoint.ClientStateStore = Direct  # the class Job's store (checkpoint.client_store) is made of


def time_store_calls() -> dict[str, list[float]]:
    """Seconds the round's own thread spends in the client-state store's ``load`` and ``save`` (per call)."""
    from fedmedbench.fl.state.client_state import ClientStateStore

    spent: dict[str, list[float]] = {"load": [], "save": []}
    for name in spent:
        call = getattr(ClientStateStore, name)

        def timed(self, *args, _call=call, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _call(self, *args, **kwargs)
            finally:
                spent[_name].append(time.perf_counter() - t0)

        setattr(ClientStateStore, name, timed)
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="scaffold")
    ap.add_argument("--model", default="timm:convnextv2_nano")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--per-client", type=int, default=16, help="training images per client (one local step)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--direct", action="store_true", help="write each client state when it is saved")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    limit_threads(args.threads)
    if args.direct:
        direct_client_states()
    workdir = Path(tempfile.mkdtemp(prefix="round_persistence_"))
    try:
        npz, part = make_data(workdir, args.clients, args.per_client, args.image_size)
        spec = RunSpec(
            run_dir=str(workdir / "run"), study="bench", dataset="dermamnist", setting="iid", method=args.method,
            seed=0, partition_path=str(part), sources={"base": str(npz)}, image_size=args.image_size,
            model=args.model, train={"rounds": args.rounds, "local_epochs": 1, "batch_size": args.per_client,
                                     "lr": 0.01, "aggregation": "uniform"},
            clients_per_round=args.per_round, device=args.device, threads=args.threads, eval_every=args.rounds,
            log_every=args.rounds)
        spent = time_store_calls()
        t0 = time.perf_counter()
        engine.run(spec, log=lambda m: None)
        total = time.perf_counter() - t0
        ends = pd.read_csv(Path(spec.run_dir) / "metrics.csv")["elapsed_s"].tolist()
        per_round = np.diff([0.0, *ends])
        emit([{"bench": "round_persistence", "code": git_head(), "method": args.method, "model": args.model,
               "clients": args.clients, "per_round": args.per_round, "rounds": args.rounds, "device": args.device,
               "client_states": "direct" if args.direct else "default", "total_s": round(total, 2),
               "steady_s_per_round": round(float(np.mean(per_round[1:-1])), 3),  # the last round also evaluates
               "round_s": [round(float(x), 3) for x in per_round],
               # the round's own thread, every round (the first round's clients have no state to load)
               "load_s_per_call": round(float(np.mean(spent["load"][args.per_round:])), 4),
               "save_s_per_call": round(float(np.mean(spent["save"])), 4)}], args.out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
