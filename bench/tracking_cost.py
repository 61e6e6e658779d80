"""What experiment tracking adds to one training job: wall seconds of a demo-sized job with tracking off,
with TensorBoard event files, and with an MLflow SQLite store (new, then existing), each job in a fresh
process as the workflow runs it (so the libraries' start-up counts).

The job is the demo quickstart's shape: synthetic BloodMNIST (600/120/240 images, 28 px), 5 IID clients,
cnn_small, 4 rounds of 1 local epoch, batch 32, one thread.

    python bench/tracking_cost.py [--repeats 3] [--rounds 4] [--out bench/results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402

from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.fl.spec import RunSpec  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402

CHILD = """
import json, sys
sys.path.insert(0, {src!r})
from fedmedbench.compat import limit_threads
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
limit_threads(1)
engine.run(RunSpec.from_dict(json.loads(sys.argv[1])), log=lambda m: None)
"""


def make_spec(workdir: Path, rounds: int) -> RunSpec:
    arrays = synthetic.generate("bloodmnist", 28, seed=0, counts={"train": 600, "val": 120, "test": 240})
    io.write_npz(workdir / "b.npz", arrays)
    labels = {s: arrays[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")}
    io.write_json(workdir / "p.json", P.build_partition(labels, "iid", 5, 0, {}, num_classes=8))
    return RunSpec(run_dir=str(workdir / "run"), study="bench", dataset="bloodmnist", setting="iid", method="fedavg",
                   seed=0, partition_path=str(workdir / "p.json"), sources={"base": str(workdir / "b.npz")}, image_size=28,
                   train={"rounds": rounds, "local_epochs": 1, "batch_size": 32, "lr": 0.05}, device="cpu", threads=1)


def job_seconds(spec: RunSpec, variant: str) -> float:
    """Seconds of the job in a fresh process; a job that fails stops the bench in one line naming its variant
    (its own output, above, says why: e.g. a tracking package not installed)."""
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    src = str(Path(__file__).resolve().parents[1] / "src")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD.format(src=src), json.dumps(spec.to_dict())])
    if done.returncode != 0:
        raise SystemExit(f"tracking_cost: the {variant} job failed (exit {done.returncode}); its output is above")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=positive, default=3)
    ap.add_argument("--rounds", type=positive, default=4)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = make_spec(work, args.rounds)
        store = f"sqlite:///{work}/mlflow.db"
        variants = {"off": {}, "tensorboard": {"tensorboard": True}, "mlflow_existing_store": {"mlflow": store}}
        times: dict[str, list[float]] = {name: [] for name in ["mlflow_new_store", *variants]}
        times["mlflow_new_store"].append(job_seconds(RunSpec.from_dict({**base.to_dict(), "tracking": {"mlflow": store}}),
                                                     "mlflow_new_store"))
        for _ in range(args.repeats):  # interleaved: a slower moment of the machine hits every variant alike
            for name, block in variants.items():
                times[name].append(job_seconds(RunSpec.from_dict({**base.to_dict(), "tracking": block}), name))
    off = statistics.median(times["off"])
    rows = [{"bench": "tracking_cost", "variant": name, "rounds": args.rounds, "job_s": [round(t, 2) for t in ts],
             "median_s": round(statistics.median(ts), 2), "added_s": round(statistics.median(ts) - off, 2),
             "commit": git_head()} for name, ts in times.items()]
    emit(rows, args.out)


if __name__ == "__main__":
    main()
