"""Peak RSS of an earlystop-style job (DermaMNIST 64 px, convnextv2_nano, 10 of N clients per round).

Each measurement runs one job in a fresh subprocess and reads its peak RSS from the OS
(``ru_maxrss`` of the child). Client state (SCAFFOLD control variates, FedDyn gradients)
lives in the on-disk per-client store, loaded only when a client is sampled, so the peak
should not grow with the number of clients.

    python bench/memory.py --methods fedavg scaffold feddyn --clients 10 100 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit  # noqa: E402
from engine_overhead import make_data, make_spec  # noqa: E402

CHILD = """
import json, sys
sys.path.insert(0, {src!r})
from fedmedbench.compat import limit_threads
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
limit_threads({threads})
engine.run(RunSpec.from_dict(json.loads(sys.argv[1])), log=lambda m: None)
"""


def peak_rss_gib(spec_json: str, threads: int) -> float:
    src = str(Path(__file__).resolve().parents[1] / "src")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run([sys.executable, "-c", CHILD.format(src=src, threads=threads), spec_json],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, max over finished children
    if peak <= before:
        raise SystemExit("peak RSS not measurable: an earlier child used more; run one measurement per process")
    return peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="timm:convnextv2_nano")
    ap.add_argument("--methods", nargs="+", default=["fedavg", "scaffold", "feddyn"])
    ap.add_argument("--clients", nargs="+", type=int, default=[100])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--local-epochs", type=float, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--single", help=argparse.SUPPRESS)  # internal: one measurement, JSON spec
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.single:
        print(peak_rss_gib(args.single, args.threads))
        return
    with tempfile.TemporaryDirectory(prefix="fmb-mem-") as tmp:
        for n in args.clients:
            workdir = Path(tmp) / f"n{n}"
            workdir.mkdir()
            npz, part = make_data(workdir, n)
            for method in args.methods:
                spec = make_spec(workdir, npz, part, args.model, args.rounds, min(10, n), args.threads, "inline")
                spec.method, spec.run_dir = method, str(workdir / method)
                spec.train["local_epochs"] = args.local_epochs
                # one measurement per parent process: ru_maxrss is a maximum over all children
                out = subprocess.run([sys.executable, __file__, "--single", json.dumps(spec.to_dict()),
                                      "--threads", str(args.threads)], capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(out.stdout[-3000:] + out.stderr[-3000:])
                row = {"bench": "memory", "model": args.model, "method": method, "clients": n, "per_round": min(10, n),
                       "rounds": args.rounds, "peak_rss_gib": round(float(out.stdout.strip().splitlines()[-1]), 2)}
                emit([row], args.out)


if __name__ == "__main__":
    main()
