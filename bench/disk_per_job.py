"""Disk left per finished job: a run's folder before and after its resume state is released.

Runs one job through the engine (synthetic data, random init), measures its folder with the
checkpoint (server checkpoint + per-client states) as a run has it at its last round, then
calls ``engine.complete`` as the Snakemake job does and measures what is left, against the
final model's size (target: at most 2x).

    python bench/disk_per_job.py --method scaffold --model timm:convnextv2_atto --size 64 --clients 10 --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit  # noqa: E402

from fedmedbench import io  # noqa: E402
from fedmedbench import partition as P  # noqa: E402
from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.fl import engine  # noqa: E402
from fedmedbench.fl.spec import RunSpec  # noqa: E402


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="scaffold")
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", type=int, default=28, choices=[28, 64, 128, 224])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="append the result row to this JSON-lines file")
    args = ap.parse_args()
    limit_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        n = 20 * args.clients
        arrays = synthetic.generate("breastmnist", args.size, seed=0, counts={"train": n, "val": n // 5, "test": n // 5})
        io.write_npz(d / "b.npz", arrays)
        labels = {s: arrays[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")}
        io.write_json(d / "p.json", P.build_partition(labels, "iid", args.clients, 0, {}, num_classes=2))
        spec = RunSpec(run_dir=str(d / "run"), study="bench", dataset="breastmnist", setting="iid", method=args.method,
                       seed=0, partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=args.size,
                       model=args.model, device="cpu", threads=args.threads,
                       train={"rounds": args.rounds, "local_epochs": 1, "batch_size": 20, "lr": 0.01})
        engine.run(spec, log=lambda m: None)
        run = Path(spec.run_dir)
        with_checkpoint = folder_bytes(run)
        engine.complete(spec, log=lambda m: None)
        left = folder_bytes(run)
        model = (run / "model.pt").stat().st_size
        emit([{"bench": "disk_per_job", "method": args.method, "model": args.model, "clients": args.clients,
               "size": args.size, "rounds": args.rounds, "bytes_with_checkpoint": with_checkpoint, "bytes_left": left,
               "model_bytes": model, "left_over_model": round(left / model, 3),
               "files_left": sorted(p.name for p in run.iterdir())}], args.out)


if __name__ == "__main__":
    main()
