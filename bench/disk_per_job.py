"""Disk left per finished job: a run's folder before and after its resume state is released.

Runs one job through the engine (synthetic data, random init), measures its folder with the
checkpoint (server checkpoint + per-client states) as a run has it at its last round, then
calls ``engine.complete`` as the Snakemake job does and measures what is left, against the
final model's size (target: at most 2x).

    python bench/disk_per_job.py --method scaffold --model timm:convnextv2_atto --size 64 --clients 10 --rounds 2

``--surgical-dir`` runs one ultraflwr job instead (the study config's first group and setting, one round of
one local epoch at ``--size`` px, FedAvg, random init) on that surgical data folder, e.g. a stand-in of
``surgical_stand_in.py``, and also measures its working files (``work/``: the staged links to every frame,
Ultralytics' label caches and training folders). Sizes are bytes on disk (links as themselves); the
working files grow with the frames, so a stand-in's are also scaled to all of the papers' frames.

    python bench/disk_per_job.py --surgical-dir /tmp/si-uf --size 64
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.data.medmnist import SIZES  # noqa: E402
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec  # noqa: E402
from fedmedbench.fl.state import checkpoint, scratch  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", help="the MedMNIST job's method (default scaffold)")
    ap.add_argument("--model", help="the MedMNIST job's model (default cnn_small)")
    ap.add_argument("--clients", type=positive, help="the MedMNIST job's clients (default 10)")
    ap.add_argument("--rounds", type=positive, help="the MedMNIST job's rounds (default 2)")
    ap.add_argument("--size", type=int, default=28, choices=SIZES)
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--out", type=Path, default=None, help="append the result row to this JSON-lines file")
    ap.add_argument("--surgical-dir", type=Path, default=None, help="time an ultraflwr job on this surgical data folder")
    ap.add_argument("--config", type=Path, help="the ultraflwr study config (with --surgical-dir; default "
                    "config/studies/ultraflwr.yaml)")
    ap.add_argument("--image-cache", default=None, help="engine.image_cache for the ultraflwr job (with --surgical-dir)")
    args = ap.parse_args()
    check_options(args)
    limit_threads(args.threads)
    if args.surgical_dir:
        import grid_cost

        config = grid_cost.load_config(args.config or Path(__file__).resolve().parents[1] / "config/studies/ultraflwr.yaml")
        emit([ultraflwr_job(config, args.surgical_dir, args.size, args.threads, args.image_cache)], args.out)
        return
    args.method, args.model = args.method or "scaffold", args.model or "cnn_small"
    args.clients, args.rounds = args.clients or 10, args.rounds or 2
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


def check_options(args: argparse.Namespace) -> None:
    """Exit with one line when an option of the other kind of job is given (the row would read as if it were used),
    or the MedMNIST job's method is not one the engine has."""
    medmnist = [f"--{k}" for k in ("method", "model", "clients", "rounds") if getattr(args, k) is not None]
    surgical = [f"--{k.replace('_', '-')}" for k in ("config", "image_cache") if getattr(args, k) is not None]
    if args.surgical_dir and medmnist:
        sys.exit(f"disk_per_job: {' and '.join(medmnist)} {'applies' if len(medmnist) == 1 else 'apply'} to the "
                 "MedMNIST job, not the ultraflwr job of --surgical-dir")
    if not args.surgical_dir and surgical:
        sys.exit(f"disk_per_job: {' and '.join(surgical)} {'applies' if len(surgical) == 1 else 'apply'} to the "
                 "ultraflwr job only: give --surgical-dir")
    from fedmedbench.fl.api.registry import available_methods

    if args.method is not None and args.method not in available_methods():
        sys.exit(f"disk_per_job: --method {args.method}: no such method ({', '.join(available_methods())})")


def ultraflwr_job(config: dict, surgical: Path, size: int, threads: int, image_cache: str | None = None) -> dict:
    """One FedAvg job of the study config's first group and setting (one round of one local epoch at ``size``
    px) on the surgical data folder ``surgical``: the run folder at its end, as the code before left it (the
    resume state removed) and as ``engine.complete`` leaves it now."""
    from _surgical_cost import data_label, export_manifest, stand_in

    from fedmedbench.studies.ultraflwr import runs as UFR

    uf = config["ultraflwr"]
    group, settings = next(iter(uf["groups"].items()))
    small = {**uf, "train": {**uf["train"], "rounds": 1, "epochs": 1, "imgsz": size}, "eval": {**uf["eval"], "every": 1}}
    r = {"ugroup": group, "usetting": settings[0], "strategy": "FedAvg", "seedset": uf["seed_sets"][0]}
    export_manifest(surgical, group, settings[0])
    label = data_label(stand_in(surgical))
    with tempfile.TemporaryDirectory() as tmp:
        d = {**UFR.run_spec(small, r, str(surgical.resolve()), None, "cpu", "timing"),
             "run_dir": str(Path(tmp) / "run"), "threads": threads, "image_cache": image_cache}
        spec = RunSpec.from_dict(d)
        engine.run(spec, log=lambda m: None)
        run = Path(spec.run_dir)
        at_end = scratch.usage(run)
        work = scratch.usage(scratch.scratch_dir(run))
        checkpoint.release(run)  # what the code before left: the resume state removed, the working files kept
        before = scratch.usage(run)
        engine.complete(spec, log=lambda m: None)
        now = scratch.usage(run)
        model = (run / "model.pt").stat().st_size
        files_left = sorted(p.name for p in run.iterdir())
    scale = 1.0 / label["fraction"]
    return {"bench": "disk_per_job", "study": "ultraflwr", "group": group, "setting": settings[0], "size": size,
            "image_cache": bool(image_cache), **label, "model_bytes": model,
            "bytes_at_end": at_end[0], "entries_at_end": at_end[1],
            "work_bytes": work[0], "work_entries": work[1],
            "bytes_left_before": before[0], "entries_left_before": before[1],
            "bytes_left": now[0], "entries_left": now[1], "files_left": files_left,
            "left_over_model_before": round(before[0] / model, 3), "left_over_model": round(now[0] / model, 3),
            "at_all_frames": {"work_bytes": round(work[0] * scale), "work_entries": round(work[1] * scale),
                              "left_over_model_before": round((before[0] - work[0] + work[0] * scale) / model, 2)},
            "code": git_head()}


if __name__ == "__main__":
    main()
