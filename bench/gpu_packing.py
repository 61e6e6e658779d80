"""Several training jobs on one GPU: seconds per round per job, and the GPU's throughput, for 1..N jobs at once.

Each job is its own process (as Snakemake runs them: ``--resources gpu=N`` on one machine, or
several runs in one SLURM allocation) running one study job of the paper configuration through
the engine (``bench/grid_cost.py``'s job: the study's model, image size, clients, local epochs,
batch size, optimizer) on synthetic data of the study's dataset. The data and partition are
written once and shared. For each count N the N jobs start together; a job's s/round is the mean
of its rounds after the first (which builds caches); throughput is rounds per second over all jobs,
relative to one job alone. A count whose jobs fail (e.g. out of GPU memory) is the last one run: the row keeps
the counts before it with that one's exit codes, and the bench exits 1. Each job also reports the GPU memory it reserved at its peak
(``torch.cuda.max_memory_reserved``; the CUDA context, a few hundred MiB a process, comes on top): the
figure a config declares for packing (``resources.train_gpu_mem_mb``, ``ultraflwr.resources.gpu_mem_mb``).

ultraflwr and fedst jobs (``--study ultraflwr|fedst``) train on the pipeline's exports or a stand-in
(``--surgical-dir``, as ``grid_cost.py``) with the config's loading (frame or clip store, read-ahead): ultraflwr's
first group's first setting, ``--surgical-epochs`` local epochs a round; fedst's main variant.

    python bench/gpu_packing.py --config config/studies/earlystop.yaml --jobs 1 2 4 8 --rounds 4 [--[no-]batch-clients]
    python bench/gpu_packing.py --config config/studies/ultraflwr.yaml --study ultraflwr --surgical-dir <stand-in> \
        --method FedAvg --jobs 1 4 8 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import grid_cost  # noqa: E402
from _cli import positive  # noqa: E402
from _report import emit, tree_state  # noqa: E402
from _timing import steady_s_per_round  # noqa: E402

#: the surgical studies this bench packs: their exports' folder under --surgical-dir, and the config key of
#: their methods' names
SURGICAL = {"ultraflwr": ("yolo", "strategies"), "fedst": ("clips", "methods")}


def worker(args: argparse.Namespace) -> None:
    """One job: run it, print its per-round seconds and its peak reserved GPU memory as JSON."""
    import torch

    from fedmedbench.compat import limit_threads

    limit_threads(args.threads)
    specs = {"ultraflwr": ultraflwr_spec, "fedst": fedst_spec}
    spec = specs.get(args.study, medmnist_spec)(args)
    # alone, or N seeds side by side in the process: a job's share of each round's wall time
    alone = grid_cost.side_by_side_why_not(spec) if args.runs_together > 1 else None  # then timed alone
    per_round = grid_cost.job_seconds_a_round(spec, args.runs_together)
    peak = torch.cuda.max_memory_reserved() / 2**20 if torch.cuda.is_available() else 0.0
    print(json.dumps({"per_round": per_round, "peak_reserved_mib": round(peak), "timed_alone": alone}), flush=True)


def ultraflwr_spec(args: argparse.Namespace):
    """The job of ``grid_cost.py``'s ultraflwr timing: the first group's first setting, the config's loading."""
    from _surgical_cost import image_cache_of, timed_epochs, ultraflwr_job

    config = grid_cost.load_config(args.config)
    uf, engine = config["ultraflwr"], config["engine"]
    group, settings = next(iter(uf["groups"].items()))
    return ultraflwr_job(config, args.surgical_dir, group, settings[0], args.method, args.rounds,
                         timed_epochs(config, args.surgical_epochs), args.device, args.threads,
                         args.workdir / f"job{args.index}",
                         int(uf["train"].get("workers", 0)), int(engine.get("loader_workers", 0)),
                         image_cache_of(config, str(args.image_cache) if args.image_cache else None))


def fedst_spec(args: argparse.Namespace):
    """The job of ``grid_cost.py``'s fedst timing (the main variant, seed 0), the config's loading."""
    from _surgical_cost import data_label, fedst_job, fedst_timed_config, image_cache_of, stand_in

    config = grid_cost.load_config(args.config)
    engine = config["engine"]
    timed = fedst_timed_config(config["fedst"], args.rounds, data_label(stand_in(args.surgical_dir))["fraction"],
                               args.surgical_steps)
    return fedst_job(timed, args.surgical_dir / "clips", args.method, args.workdir / f"job{args.index}", args.device,
                     args.threads, int(engine.get("loader_workers", 0)),
                     image_cache_of(config, str(args.image_cache) if args.image_cache else None))


def medmnist_spec(args: argparse.Namespace):
    """The study's first job (``grid_cost.py``'s), with ``--method``, on the shared synthetic data."""
    config = grid_cost.load_config(args.config)
    st = config["studies"][args.study]
    if args.batch_clients is not None:  # train.batch_clients: each job trains its round's clients together, or not
        st["train"]["batch_clients"] = args.batch_clients
    first = grid_cost.grid_jobs(config, args.study)[0]
    job = {**first, "method": args.method}
    sources = grid_cost.data_sources(st["settings"][job["setting"]], args.npz)
    return grid_cost.job_spec(args.workdir / f"job{args.index}", config, args.study, job, args.partition, sources,
                              args.rounds, args.device, args.threads)


def surgical_input(config: dict, study: str, surgical: Path) -> Path:
    """The first file a packed surgical job reads: ultraflwr's first group's first setting's manifest, fedst's
    sites.json."""
    if study == "ultraflwr":
        if not config["ultraflwr"].get("groups"):
            sys.exit("gpu_packing: --study ultraflwr: the config has no ultraflwr.groups to train")
        group, settings = next(iter(config["ultraflwr"]["groups"].items()))
        return surgical / "yolo" / group / settings[0] / "manifest.json"
    return surgical / "clips" / "sites.json"


def check_medmnist_args(config: dict, args: argparse.Namespace) -> None:
    """Exit with one line when ``--study`` is not a study of the config or ``--method`` not one of its methods
    (else every job would fail with its own traceback)."""
    studies = config.get("studies") or {}
    if args.study not in studies:
        sys.exit(f"gpu_packing: --study {args.study}: not a study of {args.config} "
                 f"({', '.join([*studies, *SURGICAL])})")
    methods = studies[args.study]["methods"]
    if args.method not in methods:
        sys.exit(f"gpu_packing: --method {args.method}: not one of {args.config}'s studies.{args.study}.methods "
                 f"({', '.join(methods)})")


def check_names(config: dict, args: argparse.Namespace) -> None:
    """Exit with one line when the study, its method or a MedMNIST-only option does not fit the config (the checks
    before any job starts, without the data)."""
    if args.study not in SURGICAL:
        check_medmnist_args(config, args)
        return
    _, names = SURGICAL[args.study]
    if args.batch_clients is not None or args.runs_together > 1:  # MedMNIST train keys: not the surgical jobs'
        sys.exit(f"gpu_packing: --[no-]batch-clients and --runs-together apply to the MedMNIST studies, not "
                 f"{args.study}")
    if args.method not in config[args.study][names]:
        sys.exit(f"gpu_packing: --method {args.method}: not one of {args.config}'s {args.study}.{names} "
                 f"({', '.join(config[args.study][names])})")


def check_surgical_options(args: argparse.Namespace) -> None:
    """Exit with one line when an option only the surgical studies' jobs take is given for a study that ignores it
    (the row would read as if timed with it)."""
    surgical_only = {"--surgical-dir": args.surgical_dir, "--surgical-epochs": args.surgical_epochs,
                     "--surgical-steps": args.surgical_steps, "--image-cache": args.image_cache}
    takes = {"ultraflwr": {"--surgical-dir", "--surgical-epochs", "--image-cache"},
             "fedst": {"--surgical-dir", "--surgical-steps", "--image-cache"}}.get(args.study, set())
    given = [flag for flag, value in surgical_only.items() if value is not None and flag not in takes]
    if given:
        kind = ({"fedst": "ultraflwr", "ultraflwr": "fedst"}[args.study] if args.study in SURGICAL
                else "the surgical studies (ultraflwr, fedst)")
        sys.exit(f"gpu_packing: {' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} to {kind} only, "
                 f"not {args.study}")


def run_jobs(n: int, args: argparse.Namespace, npz: Path, part: Path, workdir: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--device", args.device, "--config", str(args.config), "--study", args.study,
           "--method", args.method, "--rounds", str(args.rounds), "--threads", str(args.threads),
           "--workdir", str(workdir)]
    if args.study in SURGICAL:
        cmd += ["--surgical-dir", str(args.surgical_dir), "--surgical-epochs", str(args.surgical_epochs)]
        if args.image_cache:
            cmd += ["--image-cache", str(args.image_cache)]
        if args.surgical_steps:
            cmd += ["--surgical-steps", str(args.surgical_steps)]
    else:
        cmd += ["--npz", str(npz), "--partition", str(part)]
    if args.batch_clients is not None:
        cmd.append("--batch-clients" if args.batch_clients else "--no-batch-clients")
    if args.runs_together > 1:
        cmd += ["--runs-together", str(args.runs_together)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*cmd, "--index", str(i)], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
             for i in range(n)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    if any(p.returncode for p in procs):  # e.g. out of GPU memory: the counts before it are kept
        return {"jobs": n, "failed_exit_codes": [p.returncode for p in procs], "wall_s": round(wall, 1)}
    per_job, peaks, alone = [], [], set()
    for out in outs:
        reply = json.loads(out.strip().splitlines()[-1])
        per_job.append(steady_s_per_round(reply["per_round"]))
        peaks.append(reply["peak_reserved_mib"])
        alone.update([reply["timed_alone"]] if reply.get("timed_alone") else [])
    result = {"jobs": n, "s_per_round": [round(x, 3) for x in per_job], "mean_s_per_round": round(sum(per_job) / n, 3),
              "rounds_per_s": round(sum(1 / x for x in per_job), 3), "wall_s": round(wall, 1),
              "peak_reserved_mib": max(peaks)}
    if alone:  # --runs-together: the seeds could not share their rounds and were timed one by one (why)
        result["timed_alone"] = "; ".join(sorted(alone))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "studies" / "earlystop.yaml")
    ap.add_argument("--study", default="earlystop")
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--jobs", type=positive, nargs="+", default=[1, 2, 4, 8], help="job counts to run, in order")
    ap.add_argument("--rounds", type=positive, default=4)
    ap.add_argument("--threads", type=positive, default=2, help="torch threads per job")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda (cpu only to try the script)")
    ap.add_argument("--batch-clients", action=argparse.BooleanOptionalAction, default=None,
                    help="train.batch_clients in every job, or not (default: the config's)")
    ap.add_argument("--runs-together", type=positive, default=1, metavar="N",
                    help="the MedMNIST studies: each process runs N seeds of its job side by side (train.seeds_together; "
                    "with --batch-clients), a job's seconds a round its share of the wall time; seeds that cannot share their rounds "
                    "are timed alone, named in the count's timed_alone (default 1)")
    ap.add_argument("--surgical-dir", type=Path, help="ultraflwr, fedst: the exports or stand-in to train on")
    ap.add_argument("--surgical-epochs", type=int, help="ultraflwr: local epochs a round (at least 2; default 2)")
    ap.add_argument("--surgical-steps", type=positive, help="fedst: local steps a round (and FedST's server steps cut "
                    "by the same share; default: the config's)")
    ap.add_argument("--image-cache", type=Path, help="ultraflwr, fedst: the decoded frames' folder (engine.image_cache; "
                    "default: the config's)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="check the options against the config, then stop")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--npz", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--partition", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    check_surgical_options(args)
    if args.surgical_epochs is None:
        args.surgical_epochs = 2
    if args.dry_run:
        check_names(grid_cost.load_config(args.config), args)
        print(f"gpu_packing: would run {' then '.join(map(str, args.jobs))} {args.study} {args.method} job(s) of "
              f"{args.rounds} rounds")
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_packing needs a CUDA device")
    config = grid_cost.load_config(args.config)
    tree = tree_state()
    row = {"bench": "gpu_packing", "study": args.study, "method": args.method, "rounds": args.rounds,
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": tree["commit"], "tree_clean": tree["tree_clean"]}
    with tempfile.TemporaryDirectory(prefix="fmb-pack-") as tmp:
        workdir = Path(tmp)
        if args.study in SURGICAL:
            export, names = SURGICAL[args.study]
            if args.batch_clients is not None or args.runs_together > 1:  # MedMNIST train keys: not the surgical jobs'
                sys.exit(f"gpu_packing: --[no-]batch-clients and --runs-together apply to the MedMNIST studies, not "
                         f"{args.study}")
            first = args.surgical_dir and surgical_input(config, args.study, args.surgical_dir)
            if not first or not first.is_file():
                sys.exit(f"gpu_packing: --surgical-dir {args.surgical_dir}: no {export}/ exports there"
                         f"{f' ({first} is missing)' if first else ''} (bench/surgical_stand_in.py builds a stand-in)")
            if args.method not in config[args.study][names]:
                sys.exit(f"gpu_packing: --method {args.method}: not one of {args.config}'s {args.study}.{names} "
                         f"({', '.join(config[args.study][names])})")
            npz = part = None
            row["surgical_dir"] = str(args.surgical_dir)
            if args.study == "ultraflwr":
                from _surgical_cost import timed_epochs

                row["surgical_epochs"] = timed_epochs(config, args.surgical_epochs)
            elif args.surgical_steps:
                row["surgical_steps"] = args.surgical_steps
        else:
            check_medmnist_args(config, args)
            first = grid_cost.grid_jobs(config, args.study)[0]
            part, sources = grid_cost.make_data(workdir, config, args.study, first["setting"], first["dataset"])
            npz = Path(next(iter(sources.values())))
            row["batch_clients"] = bool(config["studies"][args.study]["train"].get("batch_clients")
                                        if args.batch_clients is None else args.batch_clients)
        results = []
        for n in args.jobs:  # up to the first count whose jobs fail (more would fail alike)
            results.append(run_jobs(n, args, npz, part, workdir))
            if "failed_exit_codes" in results[-1]:
                break
    done = [r for r in results if "failed_exit_codes" not in r]
    for r in done:
        r["throughput_vs_one"] = round(r["rounds_per_s"] / (done[0]["rounds_per_s"] / done[0]["jobs"]), 2)
    emit([{**row, "runs_together": args.runs_together, "threads_per_job": args.threads, "mps": os.environ.get("FMB_MPS") == "1",
           "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "results": results}], args.out)
    if len(done) < len(results):
        failed = results[-1]
        sys.exit(f"gpu_packing: {failed['jobs']} jobs: a job failed (exit codes {failed['failed_exit_codes']}; its "
                 "error above); the row keeps the counts before it")


if __name__ == "__main__":
    main()
