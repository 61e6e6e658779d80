"""What a study's paper grid costs on this machine: a few timed rounds per method, times the grid.

For each classification study of a config (``config/studies/*.yaml``), one job per timed method
runs the study's own configuration (model, image size, clients, clients per round, local epochs,
batch size, optimizer, method parameters, evaluation schedule) on synthetic data of the study's
dataset at its official split sizes, through the engine, on ``--device``. Seconds per round
(the first round, which builds caches, is timed apart and left out when more than one round
runs) times every job's round budget gives the grid's device-hours, one job at a time.
Methods not timed (``--methods``) are costed at the mean of the timed ones (said in the row).
The surgical video studies (fedst, ultraflwr) time their jobs on the pipeline's own surgical data,
which must be built first, or on a synthetic stand-in at the papers' frame counts
(``surgical_stand_in.py``; ``_surgical_cost.py``; ``--surgical-dir``).

    python bench/grid_cost.py --config config/studies/earlystop.yaml --rounds 3 --methods fedavg scaffold
    python bench/grid_cost.py --config config/studies/fedst.yaml --rounds 3 --methods fedst seg_fedavg
    python bench/grid_cost.py --config config/studies/ultraflwr.yaml --rounds 3 --methods FedAvg
    python bench/surgical_stand_in.py --config config/studies/ultraflwr.yaml --out /tmp/si-uf --fraction 0.05
    python bench/grid_cost.py --config config/studies/ultraflwr.yaml --surgical-dir /tmp/si-uf --rounds 3 --methods FedAvg

Each row also gives the arithmetic floor of a round (``_flop_floor.py``: FLOPs counted on the study's own model,
training = 3 x forward, at 30 % and 10 % of the device's dense peak), the measured time over it, the grid's
device-hours with ``--packing`` (the measured throughput of jobs sharing a device) and the floor's; a summary row
per study (``study``, ``device``, ``commit``, ``grid_gpu_hours``, ``floor_gpu_hours_30``, ``levers``, ...) is
appended to ``bench/grid_cost_results.jsonl`` and a line printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
#: where each study's summary row is appended (``--results``)
RESULTS = ROOT / "bench" / "grid_cost_results.jsonl"

from _cli import above_zero, check_cuda, positive, whole  # noqa: E402
from _flop_floor import dense_peak, device_name, floor_fields, forward_flops, round_flops  # noqa: E402
from _report import append_lines, emit, tree_state  # noqa: E402
from _surgical_cost import fedst_cost, timed_names, ultraflwr_cost  # noqa: E402
from _timing import progress, steady_s_per_round, time_spec, time_specs_together, waiting_steps  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.data import synthetic  # noqa: E402
from fedmedbench.data.medmnist import dataset_info  # noqa: E402
from fedmedbench.fl.api import method_params  # noqa: E402
from fedmedbench.fl.spec import RunSpec  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.studies import grid  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402


def load_config(path: Path) -> dict:
    """The config with the schema's defaults filled in, as the workflow sees it (the workflow's own check, which
    needs no Snakemake: a bare GPU node has none)."""
    from fedmedbench.config.check import check_file
    from fedmedbench.workflow.diagnostics import exit_on_config_error, validate_config

    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such config file")
    with exit_on_config_error([path]):  # a bad value or YAML is one line naming the file and key, as the workflow's
        check_file(path)  # bounded and strict first (a JSON file it checks, but leaves to the reader)
        config = yaml.safe_load(Path(path).read_text()) or {}
        validate_config(config, ROOT / "config" / "schema.yaml")
    return config


def grid_jobs(config: dict, study: str) -> list[dict]:
    """Every training job of the study (a run shown in several settings trains once), with its round budget."""
    st = config["studies"][study]
    return [{**r, "rounds": int(grid.run_train(st, r["setting"], r["method"])["rounds"])} for r in grid.trained_runs(st)]


def make_data(workdir: Path, config: dict, study: str, setting: str, dataset: str) -> tuple[Path, dict[str, str]]:
    """Synthetic data at the official split sizes and the setting's partition (every domain reads the same file:
    corruptions change pixels, not the cost)."""
    st = config["studies"][study]
    s = st["settings"][setting]
    arrays = synthetic.generate(dataset, st["size"], seed=0, counts=dataset_info(dataset).n_samples)
    npz = workdir / f"{dataset}_{st['size']}.npz"
    io.write_npz(npz, arrays)
    labels = {k: arrays[f"{k}_labels"].reshape(-1) for k in ("train", "val", "test")}
    n_classes = int(max(v.max() for v in labels.values())) + 1
    part = workdir / f"{setting}.json"
    io.write_json(part, P.build_partition(labels, s["scheme"], s["num_clients"], 0, s.get("params", {}), n_classes,
                                          draws=st.get("random_draws", "project")))
    return part, data_sources(s, npz)


def data_sources(setting: dict, npz: Path) -> dict[str, str]:
    """Every data source the setting's partition reads, each the one synthetic file ``npz``."""
    return {name: str(npz) for name in P.source_names(setting["scheme"], setting.get("params", {}))}


def job_spec(workdir: Path, config: dict, study: str, job: dict, part: Path, sources: dict[str, str], rounds: int,
             device: str, threads: int) -> RunSpec:
    """The job's spec as the workflow resolves it (rules/common.smk's ``run_spec``), for ``rounds`` rounds,
    with a random-init model (the pretrained weights do not change the cost)."""
    st = config["studies"][study]
    setting, method = job["setting"], job["method"]
    return RunSpec(
        run_dir=str(workdir / f"run-{method}"), study=study, dataset=job["dataset"], setting=setting,
        method=method, seed=0, partition_path=str(part), sources=sources, image_size=st["size"],
        model=grid.run_model(st, method)["name"], train={**grid.run_train(st, setting, method), "rounds": rounds},
        clients_per_round=st["clients_per_round"],
        method_params=method_params.resolve(method, st["method_params"], st["settings"][setting]),
        device=device, threads=threads,
        eval_every=min(st["eval_every"], rounds), log_every=rounds, save_client_models=st["save_client_models"],
        client_validation=st.get("client_validation"), random_draws=st.get("random_draws", "project"),
    )


def timed_job(jobs: list[dict], setting: str | None) -> dict:
    """The job whose dataset and setting are timed: the grid's first, or its first of ``setting``."""
    if setting is None:
        return jobs[0]
    match = next((j for j in jobs if j["setting"] == setting), None)
    if match is None:
        raise SystemExit(f"grid_cost: --setting {setting}: no such setting (the grid's: "
                         f"{', '.join(sorted({j['setting'] for j in jobs}))})")
    return match


def pair_factors(ref_rates: dict[tuple[str, str], float], base: tuple[str, str]) -> Callable[[str, str], float]:
    """How much a job of (dataset, setting) costs against the timed pair ``base``, from the reference method's
    seconds a round on each timed pair (``ref_rates``, ``base`` among them): a timed pair its own ratio; any other
    its dataset's ratio on the base setting times the base dataset's ratio on its setting (1 where untimed)."""
    b = ref_rates[base]

    def factor(dataset: str, setting: str) -> float:
        if (dataset, setting) in ref_rates:
            return ref_rates[dataset, setting] / b
        return ref_rates.get((dataset, base[1]), b) / b * ref_rates.get((base[0], setting), b) / b

    return factor


def grid_seconds(jobs: list[dict], s_per_round: dict[str, float], factor: Callable[[str, str], float]) -> float:
    """Every job's rounds at its method's seconds a round on the timed pair (untimed methods at the timed ones'
    mean), scaled by its (dataset, setting)'s ``factor``."""
    fallback = float(np.mean(list(s_per_round.values())))
    return sum(j["rounds"] * s_per_round.get(j["method"], fallback) * factor(j["dataset"], j["setting"]) for j in jobs)


def scaled_job(jobs: list[dict], pair: str, method: str) -> dict:
    """The grid's job of ``pair`` ("dataset/setting") with ``method``."""
    dataset, _, setting = pair.partition("/")
    match = next((j for j in jobs if j["dataset"] == dataset and j["setting"] == setting), None)
    if match is None:
        raise SystemExit(f"grid_cost: --scale-by {pair}: no such dataset/setting in the grid (e.g. "
                         f"{jobs[0]['dataset']}/{jobs[0]['setting']})")
    return {**match, "method": method}


def side_by_side_why_not(spec: RunSpec) -> str | None:
    """Why the job's runs side by side would not share their rounds (each trains its clients one by one), or None."""
    if not spec.train.get("batch_clients"):
        return "train.batch_clients is off"
    from fedmedbench.fl.engine import federation as fed

    return fed.why_not_together(fed.Job(fed.resolve_data_shapes(spec)))


def job_seconds_a_round(spec: RunSpec, runs_together: int) -> list[float]:
    """Seconds of each round of the job, alone, or side by side with runs of its other seeds in one process
    (``runs_together`` > 1: each round's wall time shared by them, a job's share)."""
    if runs_together <= 1:
        return time_spec(spec)
    reason = side_by_side_why_not(spec)
    if reason:  # its runs would withdraw and take turns, each timed as alone: a round's wall time over N is no share
        progress(f"--runs-together {runs_together}: {spec.method} cannot share its rounds ({reason}): timed alone")
        return time_spec(spec)
    specs = [dataclasses.replace(spec, seed=seed, run_dir=f"{spec.run_dir}-seed{seed}") for seed in range(runs_together)]
    return [s / runs_together for s in time_specs_together(specs)]


def dataset_pairs(jobs: list[dict], first: dict, scale_by: list[str] | None) -> list[str]:
    """The (dataset, setting) pairs timed with the reference method besides ``first``'s: ``scale_by``'s, and each other
    dataset's job of ``first``'s setting (else its first job) where they lack it: every dataset is timed, on the
    setting that gives its ratio to the timed one (:func:`pair_factors`)."""
    pairs = list(scale_by or [])
    covered = {first["dataset"]}
    for job in jobs:
        if job["dataset"] not in covered:
            same = next((j for j in jobs if j["dataset"] == job["dataset"] and j["setting"] == first["setting"]), job)
            if f"{same['dataset']}/{same['setting']}" not in pairs:
                pairs.append(f"{same['dataset']}/{same['setting']}")
            covered.add(job["dataset"])
    return pairs


def steady_rounds(rounds: int) -> int:
    """The rounds a job's seconds a round are the mean of (``steady_s_per_round``: all but the first, or the one)."""
    return rounds - 1 if rounds > 1 else 1


def study_cost(config: dict, study: str, methods: list[str] | None, rounds: int, device: str, threads: int,
               workdir: Path, setting: str | None = None, torch_profile: Path | None = None,
               scale_by: list[str] | None = None, runs_together: int = 1, one_pair: bool = False) -> dict:
    st = config["studies"][study]
    jobs = grid_jobs(config, study)
    row = {"bench": "grid_cost", "study": study, "device": device, "jobs": len(jobs),
           "job_rounds": sum(j["rounds"] for j in jobs), "model": st["model"]["name"]}
    # every method unless --methods names some (names of other studies skipped)
    timed = [m for m in (methods or st["methods"]) if m in st["methods"]] or st["methods"][:1]
    first = timed_job(jobs, setting)
    pairs = list(scale_by or []) if one_pair else dataset_pairs(jobs, first, scale_by)
    others = [scaled_job(jobs, pair, timed[0]) for pair in pairs]  # checked before anything is timed
    part, sources = make_data(workdir, config, study, first["setting"], first["dataset"])
    alone: dict[str, str] = {}  # the jobs --runs-together could not time side by side, and why

    def seconds_a_round(spec: RunSpec, label: str) -> list[float]:
        if runs_together > 1 and (reason := side_by_side_why_not(spec)):
            alone[label] = reason
        return job_seconds_a_round(spec, runs_together)

    s_per_round: dict[str, float] = {}
    for method in timed:
        spec = job_spec(workdir, config, study, {**first, "method": method}, part, sources, rounds, device, threads)
        per_round = seconds_a_round(spec, method)
        s_per_round[method] = steady_s_per_round(per_round)
        row.setdefault("first_round_s", {})[method] = round(per_round[0], 2)
    if torch_profile is not None:  # one more run of the first timed method under torch.profiler
        from engine_overhead import torch_profile_engine

        spec = job_spec(workdir, config, study, {**first, "method": timed[0]}, part, sources, rounds, device, threads)
        torch_profile_engine(spec, torch_profile)
    base = (first["dataset"], first["setting"])
    ref_rates = {base: s_per_round[timed[0]]}
    work = {base: classification_work(config, study, first, part, spec)}
    for other in others:  # the first timed method on other (dataset, setting) pairs: how their rounds differ
        if (other["dataset"], other["setting"]) in ref_rates:
            continue
        pdir = workdir / f"{other['dataset']}_{other['setting']}"
        pdir.mkdir(parents=True, exist_ok=True)
        opart, osources = make_data(pdir, config, study, other["setting"], other["dataset"])
        ospec = job_spec(pdir, config, study, other, opart, osources, rounds, device, threads)
        per_round = seconds_a_round(ospec, f"{other['dataset']}/{other['setting']}")
        ref_rates[other["dataset"], other["setting"]] = steady_s_per_round(per_round)
        work[other["dataset"], other["setting"]] = classification_work(config, study, other, opart, ospec)
    for dataset in dict.fromkeys(j["dataset"] for j in jobs):  # the floor counts every dataset, timed or not
        if not any(d == dataset for d, _ in work):
            job = next((j for j in jobs if j["dataset"] == dataset and j["setting"] == first["setting"]),
                       next(j for j in jobs if j["dataset"] == dataset))
            pdir = workdir / f"{dataset}_{job['setting']}"
            pdir.mkdir(parents=True, exist_ok=True)
            opart, osources = make_data(pdir, config, study, job["setting"], dataset)
            ospec = job_spec(pdir, config, study, {**job, "method": timed[0]}, opart, osources, rounds, device, threads)
            work[dataset, job["setting"]] = classification_work(config, study, job, opart, ospec)
    seconds = grid_seconds(jobs, s_per_round, pair_factors(ref_rates, base))
    pairs = [f"{d}/{st_}" for d, st_ in ref_rates]
    untimed = sorted(set(st["methods"]) - set(s_per_round))
    if len(ref_rates) > 1:
        row["scaled_by"] = {"method": timed[0], "s_per_round": {f"{d}/{st_}": round(v, 3) for (d, st_), v in
                                                                ref_rates.items()}}
    row.update(timed_on=pairs[0], rounds_timed=rounds, runs_together=runs_together,
               s_per_round={k: round(v, 3) for k, v in s_per_round.items()},
               untimed_methods_at_mean=untimed, device_hours=round(seconds / 3600, 1),
               timed={"datasets": sorted({d for d, _ in ref_rates}), "settings": sorted({s_ for _, s_ in ref_rates}),
                      "methods": list(s_per_round), "pairs": {pairs[0]: list(s_per_round),
                                                               **{p: [timed[0]] for p in pairs[1:]}},
                      "rounds": rounds, "steady_rounds": steady_rounds(rounds), "runs_together": runs_together},
               costing=(f"each job: its method's seconds a round on {pairs[0]}"
                        + (f" x its (dataset, setting)'s ratio to {pairs[0]} ({timed[0]}'s seconds a round on "
                           f"{', '.join(pairs)}; a pair not timed: its dataset's ratio x its setting's, 1 where "
                           "neither is timed)" if len(pairs) > 1 else " (every dataset and setting at its rate)")
                        + (f"; {', '.join(untimed)} not timed: at the mean of {', '.join(s_per_round)}"
                           if untimed else "; every method timed")))
    if alone:
        row["timed_alone"] = alone
    row.update(work[base])
    row.update(grid_floor_flops(jobs, work, base))
    row["measured_s_per_round"] = round(seconds / row["job_rounds"], 4)  # over the grid's rounds, each method's own
    return row


def grid_floor_flops(jobs: list[dict], work: dict[tuple[str, str], dict], base: tuple[str, str]) -> dict:
    """The grid's FLOPs: each job's rounds at its (dataset, setting)'s FLOPs a round where that pair's work was
    counted, else its dataset's (a timed pair of it), else the base pair's; ``flops_per_round`` is their mean a
    job-round (what the floor's seconds a round and the grid's floor are taken from)."""
    by_dataset = {d: w for (d, _), w in reversed(list(work.items()))}  # a dataset's first timed pair
    total = 0.0
    for j in jobs:
        w = work.get((j["dataset"], j["setting"])) or by_dataset.get(j["dataset"]) or work[base]
        total += j["rounds"] * w["flops_per_round"]
    rounds = sum(j["rounds"] for j in jobs)
    return {"flops_per_round": total / rounds, "floor_flops": float(f"{total:.4g}"),
            "flops_per_round_by_pair": {f"{d}/{s}": w["flops_per_round"] for (d, s), w in work.items()},
            "floor_counts": "every job at its dataset's round: the sampled clients' local epochs (3 forward passes a "
                            "sample) and the validation and test sets on an evaluated round"}


def classification_work(config: dict, study: str, job: dict, part: Path, spec: RunSpec) -> dict:
    """A round's work on the timed setting and its FLOPs: the sampled clients' local epochs over their mean
    training split (of the partition), the global validation and test sets (the official split sizes) on an
    evaluated round, and one sample's forward FLOPs through the study's model builder."""
    import json

    import torch

    from fedmedbench.fl.engine.federation import resolve_data_shapes
    from fedmedbench.models import build_model

    st = config["studies"][study]
    train = grid.run_train(st, job["setting"], job["method"])
    clients = json.loads(Path(part).read_text())["clients"]
    mean_train = float(np.mean([len(c["train"]) for c in clients]))
    counts = dataset_info(job["dataset"]).n_samples
    evaluated = 1.0 / max(1, int(st["eval_every"]))  # the share of rounds evaluated (and the last)
    shapes = resolve_data_shapes(spec)  # input channels and classes as the job reads them from its data
    torch.manual_seed(0)
    model = build_model(spec.model, shapes.in_channels, shapes.num_classes, spec.image_size)
    forward = forward_flops(model, torch.zeros(1, shapes.in_channels, spec.image_size, spec.image_size))
    sampled = spec.clients_per_round or len(clients)  # none set: every client trains each round
    train_samples = sampled * mean_train * float(train["local_epochs"])
    eval_samples = (counts["val"] + counts["test"]) * evaluated
    return {"forward_flops_per_sample": forward, "train_samples_per_round": round(train_samples, 1),
            "eval_samples_per_round": round(eval_samples, 1),
            "flops_per_round": round_flops(forward, train_samples, eval_samples)}


def with_floor(row: dict, device: str, peak_tflops: float | None, packing: float, levers: list[str]) -> dict:
    """The row with the device's name, the floor at each share of its dense peak (where the row has its FLOPs a
    round), the measured time over the floor, and the grid's device-hours with ``packing`` jobs' measured
    throughput (1: one job at a time)."""
    name = device_name(device)
    out = {**row, "device_name": name, "packing_throughput": packing,
           "grid_gpu_hours": round(row["device_hours"] / packing, 1), "levers": levers}
    if "flops_per_round" in row:
        peak, source = dense_peak(device, name, peak_tflops)
        out.update(dense_peak_tflops=round(peak / 1e12, 3), dense_peak_source=source,
                   **floor_fields(row["flops_per_round"], peak, row.get("measured_s_per_round"), row["job_rounds"]))
    return out


def provenance(tree: dict, allow_dirty: bool, note: str | None = None) -> dict:
    """What a row measured besides its figures: the date (UTC), the commit and whether the tree was clean (its
    changed files where not), torch's version and, where given, the person's note (e.g. what was cut and why)."""
    import datetime

    import torch

    out = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"), "commit": tree["commit"],
           "tree_clean": tree["tree_clean"], "torch": torch.__version__}
    if not tree["tree_clean"]:
        out.update(changed=tree["changed"][:20], allow_dirty=allow_dirty)
    if tree.get("tree_given"):
        out["tree_given"] = True  # the sender's word (FMB_TREE), not git's
    if note:
        out["note"] = note
    return out


def check_tree(tree: dict, results: Path | None, allow_dirty: bool) -> None:
    """Exit with one line when this tree's own record (``RESULTS``) would get a row of uncommitted code: a row names
    a commit, and the code it timed must be that commit's (``--allow-dirty`` writes it, marked)."""
    if allow_dirty or results is None or tree["tree_clean"]:
        return
    if Path(results).resolve() != RESULTS.resolve():
        return  # another file: the row is written, marked tree_clean false
    what = (f"changed files: {', '.join(tree['changed'][:5])}{' ...' if len(tree['changed']) > 5 else ''}"
            if tree["tree_clean"] is False else "git cannot say whether the tree is clean")
    raise SystemExit(f"grid_cost: {RESULTS.relative_to(ROOT)} takes rows of committed code only ({what}); commit "
                     "them, give another --results, or --allow-dirty (the row records it)")


def result_row(row: dict) -> dict:
    """The summary kept in ``grid_cost_results.jsonl``: what each study's grid costs, on what, when, with which code,
    what was timed and how the rest was costed."""
    keys = ("study", "date", "commit", "tree_clean", "tree_given", "changed", "allow_dirty", "note", "device", "device_name",
            "torch", "threads", "bench_wall_s", "grid_gpu_hours", "device_hours", "packing_throughput", "measured_s_per_round", "timed",
            "timed_on", "rounds_timed", "s_per_round", "train_s_per_round", "eval_s", "scaled_by",
            "untimed_methods_at_mean", "untimed_strategies_at_mean", "timed_alone", "costing", "batch_padding", "jobs", "job_rounds",
            "forward_flops_per_sample", "flops_per_round", "flops_per_round_by_pair", "floor_flops", "floor_counts",
            "dense_peak_tflops",
            "floor_s_per_round_30", "floor_s_per_round_10", "measured_over_floor_30", "measured_over_floor_10",
            "floor_gpu_hours_30", "floor_gpu_hours_10", "levers", "data")
    return {k: row[k] for k in keys if k in row}


def costing_line(row: dict) -> str:
    """What a row timed and at which rate it costed the rest, in one line."""
    timed = row.get("timed", {})
    return (f"{row['study']}: timed {', '.join(timed.get('methods', []))} on {', '.join(timed.get('pairs', []))} "
            f"({timed.get('steady_rounds')} steady round(s) of {timed.get('rounds')}); {row.get('costing', '')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, nargs="+",
                    default=sorted((ROOT / "config" / "studies").glob("*.yaml")))
    ap.add_argument("--study", nargs="*", help="studies of the config to cost (default: all)")
    ap.add_argument("--methods", nargs="*", help="methods to time (default: the MedMNIST studies' every method, "
                    "fedst's fedst, ultraflwr's FedAvg; each row and line says which were costed at which rate)")
    ap.add_argument("--setting", help="the MedMNIST studies: time the jobs of this setting (default: the grid's first "
                    "job's), e.g. a quantity-skewed one, and the first method on each other dataset's job of it; the "
                    "grid is costed at their rates")
    ap.add_argument("--scale-by", nargs="+", metavar="DATASET/SETTING",
                    help="the MedMNIST studies: also time the first method on these (dataset, setting) pairs and cost "
                    "each job at its method's rate times its pair's ratio to the timed one (untimed pairs: their "
                    "dataset's ratio times their setting's)")
    ap.add_argument("--one-pair", action="store_true",
                    help="the MedMNIST studies: time the timed setting's first dataset only (and --scale-by's pairs), "
                    "not every dataset: the others are costed at its rate (the row's costing says so)")
    ap.add_argument("--autocast", choices=["none", "bf16"], help="the MedMNIST studies' train.autocast (default: the "
                    "config's; bf16 changes results)")
    ap.add_argument("--torch-profile", type=Path, help="the MedMNIST studies: one more run of the first timed method "
                    "under torch.profiler, its ops by host and by device time into this file")
    ap.add_argument("--runs-together", type=int, default=1, metavar="N",
                    help="the MedMNIST studies: time each job side by side with N-1 runs of its other seeds in one "
                    "process, their rounds' clients trained in one call (fl/engine/runs_together.py; needs train.batch_clients); "
                    "a job's seconds a round are its share of the wall time; a job whose runs cannot share their rounds is timed "
                    "alone, named in the row's timed_alone (default 1: alone)")
    ap.add_argument("--rounds", type=positive, default=3, help="rounds timed per method (the first is left out when > 1)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--surgical-dir", type=Path,
                    help="the pipeline's surgical data folder (default: resources/surgical/<surgical.origin>)")
    ap.add_argument("--surgical-epochs", type=int,
                    help="ultraflwr: local epochs per timed round (at least 2, the default; scaled up to the config's)")
    ap.add_argument("--surgical-steps", type=positive,
                    help="fedst: local steps a timed round (and FedST's server steps cut by the same share), the "
                         "round's training scaled back to the config's (default: the config's)")
    ap.add_argument("--yolo-workers", type=whole,
                    help="ultraflwr: dataloader workers of local training (ultraflwr.train.workers) and of the "
                         "evaluation (engine.loader_workers); default: the config's")
    ap.add_argument("--image-cache", type=Path,
                    help="fedst, ultraflwr: keep the decoded clips or frames in this folder (engine.image_cache); "
                         "default: the config's")
    ap.add_argument("--no-image-cache", action="store_true",
                    help="fedst, ultraflwr: decode every read, whatever the config's engine.image_cache says")
    ap.add_argument("--loader-workers", type=whole,
                    help="engine.loader_workers: fedst's threads decoding clips ahead of use; ultraflwr's evaluation "
                         "workers and, from 1, the training batches read ahead in a thread (after --yolo-workers); "
                         "default: the config's")
    ap.add_argument("--waiting-steps", action="store_true",
                    help="local steps wait for the device as before (CPU batch indices into device data, blocking "
                         "fedst batch copies): a before/after on one machine")
    ap.add_argument("--batch-clients", action=argparse.BooleanOptionalAction, default=None,
                    help="the MedMNIST studies with train.batch_clients (a round's clients trained together) or "
                    "without (default: the config's)")
    ap.add_argument("--batch-padding", type=float, metavar="X",
                    help="the MedMNIST studies with clients together: a step's clients in the fewest calls that compute "
                    "at most X times its useful samples (fl/methods/_batch_plan.py PADDING, default 1.10; inf: one "
                    "call a step, every client padded to the largest batch), for a before/after")
    ap.add_argument("--peak-tflops", type=above_zero,
                    help="the device's dense peak the floor is taken against (default: bench/_flop_floor.py's "
                         "figure for the card; a CPU's measured matrix-product rate)")
    ap.add_argument("--packing", type=float, default=1.0,
                    help="the measured throughput of the jobs packed on one device, in jobs' worth of one job alone "
                         "(bench/gpu_packing.py); grid_gpu_hours = device_hours / this (default 1: one at a time)")
    ap.add_argument("--out", type=Path, help="append the results as JSON lines")
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="append each study's summary row here (default: bench/grid_cost_results.jsonl, which takes "
                    "rows of committed code only)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="write the summary row to bench/grid_cost_results.jsonl from a tree with uncommitted changes "
                    "(the row records them)")
    ap.add_argument("--note", help="a line kept in the row: what was cut and why (e.g. fewer rounds on a CPU)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the options against the configs and print what would be timed, then stop")
    args = ap.parse_args()
    if args.runs_together < 1:
        raise SystemExit(f"grid_cost: --runs-together {args.runs_together}: give 1 or more runs")
    import torch

    if not 0 < args.packing < float("inf"):  # NaN too: every row's GPU-hours would be NaN
        raise SystemExit(f"grid_cost: --packing {args.packing:g}: give a throughput above 0")
    if args.batch_padding is not None and not args.batch_padding >= 1:  # NaN too
        raise SystemExit(f"grid_cost: --batch-padding {args.batch_padding:g}: give 1 or more (inf: one call a step)")
    if args.dry_run:
        for line in planned(args):
            print(line)
        return
    check_cuda("grid_cost", args.device)
    checked_configs(args)  # a bad config or option is said first, whatever the tree's state
    tree = tree_state()
    check_tree(tree, args.results, args.allow_dirty)  # before anything is timed
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    limit_threads(args.threads)
    import time

    started = time.perf_counter()
    with waiting_steps() if args.waiting_steps else nullcontext():
        for row in cost_rows(args, device):
            row = with_floor({**row, **provenance(tree, args.allow_dirty, args.note), "threads": args.threads,
                              "waiting_steps": args.waiting_steps,
                              "bench_wall_s": round(time.perf_counter() - started)}, device, args.peak_tflops,
                             args.packing, levers(row, args))
            started = time.perf_counter()
            emit([row], args.out)
            emit_summary(row, args.results)
            print(costing_line(row), flush=True)
            print(summary_line(row), flush=True)


def summary_line(row: dict) -> str:
    """One line a person reads: measured seconds a round, the floor at 30 % and 10 % of the peak, their ratio,
    and the grid's device-hours against the floor's."""
    line = f"{row['study']}: {row['device_name']}: grid {row['grid_gpu_hours']} device-hours"
    if "floor_s_per_round_30" in row:
        line += (f"; {row['measured_s_per_round']} s a round measured, floor {row['floor_s_per_round_30']} / "
                 f"{row['floor_s_per_round_10']} s at 30 / 10 % of {row['dense_peak_tflops']} TFLOP/s "
                 f"({row.get('measured_over_floor_30')}x / {row.get('measured_over_floor_10')}x); floor grid "
                 f"{row['floor_gpu_hours_30']} / {row['floor_gpu_hours_10']} device-hours")
    return line


def levers(row: dict, args: argparse.Namespace) -> list[str]:
    """The speed levers a row ran with (none: the configuration as it is, one job at a time)."""
    out = [f"{key}" for key in ("image_cache", "read_ahead", "batch_clients") if row.get(key)]
    if row.get("autocast", "none") != "none":
        out.append(f"autocast={row['autocast']}")
    if row.get("loader_workers"):
        out.append(f"loader_workers={row['loader_workers']}")
    if getattr(args, "batch_padding", None) is not None and row.get("batch_clients"):
        out.append(f"batch_padding={args.batch_padding:g}")
    if row.get("runs_together", 1) > 1 and not set(row["s_per_round"]) <= set(row.get("timed_alone", {})):
        out.append(f"runs_together={row['runs_together']}")
    if args.packing != 1:
        out.append(f"packing={args.packing:g}")
    if args.waiting_steps:
        out.append("waiting_steps (before)")
    return out


def emit_summary(row: dict, path: Path | None) -> None:
    """Append the row's summary (:func:`result_row`) to ``path`` as one JSON line."""
    if path is not None:
        import json

        append_lines(path, [json.dumps(result_row(row))])


def costed_studies(config: dict) -> list[str]:
    """The studies of a config this bench costs: its MedMNIST studies, fedst when enabled, ultraflwr with groups."""
    return [*config.get("studies", {}), *(["fedst"] if config["fedst"].get("enabled", False) else []),
            *(["ultraflwr"] if config["ultraflwr"].get("groups") else [])]


def check_studies(configs: dict[Path, dict], names: list[str] | None) -> None:
    """Exit with one line when ``--study`` names a study no config has (else nothing would be timed, silently)."""
    known = {s for config in configs.values() for s in costed_studies(config)}
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise SystemExit(f"grid_cost: --study {' '.join(unknown)}: not a study of "
                         f"{', '.join(str(p) for p in configs)} ({', '.join(sorted(known))})")


def timeable_methods(config: dict, study: str) -> list[str]:
    """The names ``--methods`` may give for a study: its methods (fedst's too), ultraflwr's strategies."""
    if study == "ultraflwr":
        return list(config["ultraflwr"]["strategies"])
    return list(config["fedst"]["methods"] if study == "fedst" else config["studies"][study]["methods"])


def check_methods(configs: dict[Path, dict], studies: list[str] | None, methods: list[str] | None) -> None:
    """Exit with one line when ``--methods`` names a method of none of the studies costed (a study times only its
    own names, so a misspelt one would silently time the study's first method instead)."""
    known = {m for config in configs.values() for s in costed_studies(config) if not studies or s in studies
             for m in timeable_methods(config, s)}
    unknown = [m for m in methods or [] if m not in known]
    if unknown:
        raise SystemExit(f"grid_cost: --methods {' '.join(unknown)}: not a method of the studies costed "
                         f"({', '.join(sorted(known))})")


#: options that set a MedMNIST study's run (train keys, its grid's jobs), with the value that leaves it as the
#: config has it: a surgical study's timing takes none of them
MEDMNIST_OPTIONS = {"setting": ("--setting", None), "scale_by": ("--scale-by", None), "autocast": ("--autocast", None),
                    "torch_profile": ("--torch-profile", None), "batch_clients": ("--[no-]batch-clients", None),
                    "runs_together": ("--runs-together", 1), "batch_padding": ("--batch-padding", None),
                    "one_pair": ("--one-pair", False)}


def check_medmnist_options(configs: dict[Path, dict], studies: list[str] | None, args: argparse.Namespace) -> None:
    """Exit with one line when an option only the MedMNIST studies take is given while fedst or ultraflwr is
    costed too: their rows would be timed without it, and read as if with it."""
    given = [flag for key, (flag, unset) in MEDMNIST_OPTIONS.items() if getattr(args, key) != unset]
    surgical = sorted({s for config in configs.values() for s in costed_studies(config)
                       if s in ("fedst", "ultraflwr") and (not studies or s in studies)})
    if given and surgical:
        raise SystemExit(f"grid_cost: {' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the "
                         f"MedMNIST studies only, not {' or '.join(surgical)} (costed here too: choose with --study)")


#: the options only the surgical studies' timings take, and which of them take each
SURGICAL_OPTIONS = {"surgical_dir": ("--surgical-dir", ("fedst", "ultraflwr")),
                    "surgical_epochs": ("--surgical-epochs", ("ultraflwr",)),
                    "surgical_steps": ("--surgical-steps", ("fedst",)),
                    "yolo_workers": ("--yolo-workers", ("ultraflwr",)),
                    "image_cache": ("--image-cache", ("fedst", "ultraflwr")),
                    "no_image_cache": ("--no-image-cache", ("fedst", "ultraflwr")),
                    "loader_workers": ("--loader-workers", ("fedst", "ultraflwr"))}


def check_surgical_options(configs: dict[Path, dict], studies: list[str] | None, args: argparse.Namespace) -> None:
    """Exit with one line when an option only fedst's or ultraflwr's timing takes is given and no study costed here
    takes it: every row would be timed without it, silently."""
    costed = {s for config in configs.values() for s in costed_studies(config) if not studies or s in studies}
    unused = [(flag, takers) for key, (flag, takers) in SURGICAL_OPTIONS.items()
              if getattr(args, key) not in (None, False) and not costed & set(takers)]
    if unused:
        flags = " and ".join(flag for flag, _ in unused)
        takers = " or ".join(sorted({t for _, ts in unused for t in ts}))
        raise SystemExit(f"grid_cost: {flags} {'applies' if len(unused) == 1 else 'apply'} to {takers} only, not "
                         f"{' or '.join(sorted(costed))} (costed here)")


def checked_configs(args: argparse.Namespace) -> dict[Path, dict]:
    """The configs, once every option is checked against them (one line and exit where one does not fit)."""
    configs = {path: load_config(path) for path in args.config}
    check_studies(configs, args.study)
    check_methods(configs, args.study, args.methods)
    check_medmnist_options(configs, args.study, args)
    check_surgical_options(configs, args.study, args)
    for config in configs.values():  # every study's --setting and --scale-by pairs, before the first is timed
        for study in config.get("studies", {}):
            if not args.study or study in args.study:
                jobs = grid_jobs(config, study)
                timed_job(jobs, args.setting)
                for pair in args.scale_by or []:
                    scaled_job(jobs, pair, "")
    return configs


def planned(args: argparse.Namespace) -> list[str]:
    """What a run of these options would time, a line a study (``--dry-run``)."""
    out = []
    for config in checked_configs(args).values():
        for study, st in config.get("studies", {}).items():
            if args.study and study not in args.study:
                continue
            jobs = grid_jobs(config, study)
            first = timed_job(jobs, args.setting)
            timed = [m for m in (args.methods or st["methods"]) if m in st["methods"]] or st["methods"][:1]
            pairs = list(args.scale_by or []) if args.one_pair else dataset_pairs(jobs, first, args.scale_by)
            out.append(f"{study}: would time {', '.join(timed)} on {first['dataset']}/{first['setting']}"
                       + (f", {timed[0]} on {', '.join(pairs)}" if pairs else "") + f", {args.rounds} rounds each"
                       + (f"; {', '.join(sorted(set(st['methods']) - set(timed)))} at their mean"
                          if set(st["methods"]) - set(timed) else ""))
        for name in ("fedst", "ultraflwr"):
            if name in costed_studies(config) and (not args.study or name in args.study):
                names = timeable_methods(config, name)
                timed = timed_names(name, names, args.methods)
                out.append(f"{name}: would time {', '.join(timed)}, {args.rounds} rounds each"
                           + (f"; {', '.join(m for m in names if m not in timed)} at their mean"
                              if set(names) - set(timed) else ""))
    return out


def cost_rows(args: argparse.Namespace, device: str) -> Iterator[dict]:
    """One row per study of each config, as each is timed."""
    configs = checked_configs(args)
    for path, config in configs.items():
        for study in config.get("studies", {}):
            if args.study and study not in args.study:
                continue
            if args.batch_clients is not None:  # train.batch_clients: each round's clients together, where allowed
                config["studies"][study]["train"]["batch_clients"] = args.batch_clients
            if args.autocast is not None:  # train.autocast: forward passes in bfloat16 (results change)
                config["studies"][study]["train"]["autocast"] = args.autocast
            if args.batch_padding is not None:  # the batched step's grouping of a step's clients (float32 rounding)
                from fedmedbench.fl.methods import _batch_plan

                _batch_plan.PADDING = args.batch_padding
            with tempfile.TemporaryDirectory(prefix="fmb-grid-") as tmp:
                row = study_cost(config, study, args.methods, args.rounds, device, args.threads, Path(tmp), args.setting,
                                 args.torch_profile, args.scale_by, args.runs_together, args.one_pair)
            train = config["studies"][study]["train"]
            from fedmedbench.fl.methods._batch_plan import PADDING

            yield {**row, "batch_clients": bool(train.get("batch_clients")), "autocast": train.get("autocast", "none"),
                   **({"batch_padding": PADDING} if train.get("batch_clients") else {})}
        surgical = args.surgical_dir or Path("resources") / "surgical" / config["surgical"]["origin"]
        for name, cost in (("fedst", fedst_cost), ("ultraflwr", ultraflwr_cost)):
            if name not in costed_studies(config) or (args.study and name not in args.study):
                continue
            cache = "" if args.no_image_cache else str(args.image_cache.resolve()) if args.image_cache else None
            epochs = 2 if args.surgical_epochs is None else args.surgical_epochs
            extra = ({"epochs": epochs, "workers": args.yolo_workers, "image_cache": cache,
                      "loader_workers": args.loader_workers} if name == "ultraflwr"
                     else {"workers": args.loader_workers, "image_cache": cache, "steps": args.surgical_steps})
            with tempfile.TemporaryDirectory(prefix="fmb-grid-") as tmp:
                row = cost(config, path, args.methods, args.rounds, device, args.threads, Path(tmp), surgical, **extra)
            yield row

if __name__ == "__main__":
    main()
