"""Does ``train.compile`` pay for itself in a client's local SGD? Eager vs compiled, same steps.

One process, one model, the earlystop study's step (cross-entropy, SGD with weight decay,
gradient clipping 10, batch 50, 64 px). A job runs many short client calls, so what counts is
compile time + the steps of a whole job against the eager steps; both are reported. The
compiled forward is the engine's (``fl.training.forward_fn``: one ``torch.compile``d call taking the
model as an argument), traced once and reused across client calls, so compilation is paid once per
job. Alternating eager/compiled blocks; each side's best counts.

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
from fedmedbench.fl.api import TrainConfig  # noqa: E402
from fedmedbench.fl.training import forward_fn  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps(model: nn.Module, forward, x: torch.Tensor, y: torch.Tensor, n: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=1e-3)
    _sync(x.device)
    t0 = time.perf_counter()
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(forward(x).float(), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
    _sync(x.device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    limit_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_model(args.model, 3, 7, args.size).to(device)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    y = torch.randint(0, 7, (args.batch,), device=device)
    t0 = time.perf_counter()
    compiled = forward_fn(model, TrainConfig(rounds=1, local_epochs=1, batch_size=50, lr=0.01, compile=True))
    steps(model, compiled, x, y, 2)  # compiles forward and backward
    compile_s = time.perf_counter() - t0
    steps(model, model, x, y, 2)
    eager, comp = [], []
    for _ in range(args.repeats):
        eager.append(steps(model, model, x, y, args.steps))
        comp.append(steps(model, compiled, x, y, args.steps))
    e, c = min(eager), min(comp)
    emit([{"bench": "compile_speed", "model": args.model, "device": args.device, "steps": args.steps, "threads": args.threads, "batch": args.batch, "size": args.size,
           "compile_s": round(compile_s, 2), "eager_ms_per_step": round(1000 * e / args.steps, 2),
           "compiled_ms_per_step": round(1000 * c / args.steps, 2), "speedup": round(e / c, 3),
           "break_even_steps": round(compile_s / max((e - c) / args.steps, 1e-9)) if e > c else None}], args.out)


if __name__ == "__main__":
    main()
