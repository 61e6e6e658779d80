"""How long a checkpoint write in the background stalls a launch-bound training loop.

The server checkpoint writes the round's client states (SCAFFOLD's c_i, FedDyn's h_i, ...: one
ConvNeXtV2-nano-sized state per sampled client) in a background thread while the next round trains.
On a GPU that training is Python launching small kernels, and each launch needs the GIL: whatever
the writer does with the GIL held, the loop waits for. Here the loop is tiny CPU ops (each releases
and retakes the GIL, as a kernel launch does); the bench counts the ops it completes while a thread
writes ``--writes`` states, against its rate alone, and reports the loop's lost time per write:

* ``torch.save``: the state through ``io.write_torch`` (the client-state format before);
* ``state_file``: ``fl.state_file.write_state`` (the tensors' bytes written and hashed by calls
  that release the GIL).

    python bench/state_write_gil.py --writes 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import emit, git_head  # noqa: E402

import fedmedbench  # noqa: E402, F401  (before timm: the torchvision hook)
from fedmedbench.fl.state.file_format import write_state  # noqa: E402
from fedmedbench.workflow.io import write_torch  # noqa: E402


def nano_state() -> dict:
    """A SCAFFOLD client state of ConvNeXtV2-nano (its trainable parameters, about 62 MB)."""
    import timm

    model = timm.create_model("convnextv2_nano", num_classes=7)
    return {"c_i": {n: torch.randn_like(p) for n, p in model.named_parameters()}}


def loop_rate(seconds: float) -> float:
    x = torch.zeros(1)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x.add_(1)
        n += 1
    return n / seconds


def stall(write: Callable[[int], None], writes: int, alone: float) -> dict:
    """Run ``writes`` writes in a thread while the loop runs; the loop's lost seconds per write."""
    took: list[float] = []
    failed: list[BaseException] = []

    def writer() -> None:
        t0 = time.perf_counter()
        try:
            for i in range(writes):
                write(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread below
            failed.append(exc)
        took.append(time.perf_counter() - t0)

    x = torch.zeros(1)
    thread = threading.Thread(target=writer)
    n, t0 = 0, time.perf_counter()
    thread.start()
    while thread.is_alive():
        x.add_(1)
        n += 1
    elapsed = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"the background write failed: {failed[0]}") from failed[0]
    return {"write_ms": round(took[0] / writes * 1e3, 1),
            "loop_lost_ms_per_write": round(max(0.0, elapsed - n / alone) / writes * 1e3, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writes", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per writer; the least stall counts")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    torch.set_num_threads(1)
    state = nano_state()
    mb = sum(t.numel() * t.element_size() for t in state["c_i"].values()) / 1e6
    with tempfile.TemporaryDirectory(prefix="fmb-bench-") as tmp:
        writers = {"torch.save": lambda i: write_torch(Path(tmp) / f"t{i}.pt", state),
                   "state_file": lambda i: write_state(Path(tmp) / f"s{i}.pt", state)}
        alone = loop_rate(2.0)
        runs: dict[str, list[dict]] = {name: [] for name in writers}
        for _ in range(args.repeats):
            for name, write in writers.items():
                runs[name].append(stall(write, args.writes, alone))
    best = {name: min(r, key=lambda row: row["loop_lost_ms_per_write"]) for name, r in runs.items()}
    emit([{"bench": "state_write_gil", "code": git_head(), "state_mb": round(mb, 1), "writes": args.writes,
           "loop_ops_per_s": round(alone), "best": best, "runs": runs}], args.out)


if __name__ == "__main__":
    main()
