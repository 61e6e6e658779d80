"""Does ``torch.compile`` pay for itself in a client's local SGD? Eager vs compiled, same steps.

One process, one model, the earlystop study's step (cross-entropy, SGD with weight decay,
gradient clipping 10, batch 50, 64 px). A job runs many short client calls, so what counts is
compile time + the steps of a whole job against the eager steps; both are reported. The
compiled model is built once and reused across client calls (the engine's resident model), so
compilation is paid once per job. Alternating eager/compiled blocks; each side's best counts.

    python bench/compile_speed.py --model cnn_small --steps 200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402


def steps(model: nn.Module, forward, x: torch.Tensor, y: torch.Tensor, n: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=1e-3)
    t0 = time.perf_counter()
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(forward(x).float(), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    limit_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.model, 3, 7, 64)
    x, y = torch.randn(50, 3, 64, 64), torch.randint(0, 7, (50,))
    t0 = time.perf_counter()
    compiled = torch.compile(model)
    steps(model, compiled, x, y, 2)  # compiles forward and backward
    compile_s = time.perf_counter() - t0
    steps(model, model, x, y, 2)
    eager, comp = [], []
    for _ in range(args.repeats):
        eager.append(steps(model, model, x, y, args.steps))
        comp.append(steps(model, compiled, x, y, args.steps))
    e, c = min(eager), min(comp)
    emit([{"bench": "compile_speed", "model": args.model, "steps": args.steps, "threads": args.threads,
           "compile_s": round(compile_s, 2), "eager_ms_per_step": round(1000 * e / args.steps, 2),
           "compiled_ms_per_step": round(1000 * c / args.steps, 2), "speedup": round(e / c, 3),
           "break_even_steps": round(compile_s / max((e - c) / args.steps, 1e-9)) if e > c else None}], args.out)


if __name__ == "__main__":
    main()
