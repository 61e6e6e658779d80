"""Grid cost of the surgical video studies (fedst, ultraflwr) for ``grid_cost.py``.

Their jobs read the pipeline's own surgical data (``<surgical-dir>/clips`` for fedst,
``<surgical-dir>/yolo/<group>/<setting>/manifest.json`` for ultraflwr): build those first with
Snakemake from the same config (real data for a real estimate; the demo's synthetic videos
only check the path). Each timed method runs a few rounds of the study's own configuration
through the engine; evaluation is left to the last timed round, so a round's training time and
an evaluation's time are measured apart:

    train_s = mean of rounds 2 .. R-1   eval_s = round R - train_s

and a job costs ``rounds x train_s + evaluations x eval_s`` (evaluations: every
``eval_every``-th round and the last). Weights are not loaded (random init costs the same), and
a CLIP indicator is timed as one-hot (its prompts are embedded once per job).

On a stand-in (``surgical_stand_in.py``: synthetic, at the papers' frame counts, ``stand_in.json``
beside the data) built at a fraction of the frames, the work that grows with the frames is scaled
back up: an evaluation by ``1 / test_fraction``; an ultraflwr local epoch by ``1 / fraction``. A fedst
site trains a fixed number of steps whatever its clips; its clip cache is scaled by ``fraction`` instead.
ultraflwr times ``--surgical-epochs`` local epochs per round (the paper's 20 would take hours per
timed round) and splits a round into each client's set-up and its epochs from the epoch ends
(:func:`epoch_clock`): a paper round = set-up + epochs x epoch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _flop_floor import forward_flops, round_flops
from _timing import progress, time_spec

from fedmedbench.fl.spec import RunSpec
from fedmedbench.fl.tasks.detection import yolo
from fedmedbench.fl.tasks.detection.staging import read_manifest

#: the method each surgical study times when ``--methods`` names none of its own: the paper's (FedST's evaluating
#: round included) and UltraFlwr's baseline strategy
DEFAULT_TIMED = {"fedst": "fedst", "ultraflwr": "FedAvg"}


def timed_names(study: str, names: list[str], methods: list[str] | None) -> list[str]:
    """The names of ``names`` a surgical study times: those ``methods`` gives, else its default (else its first)."""
    return [m for m in (methods or [DEFAULT_TIMED[study]]) if m in names] or list(names[:1])


def stand_in(surgical: Path) -> dict[str, Any] | None:
    """The stand-in record of a surgical data folder (None for the pipeline's own data)."""
    if (surgical / ".building").exists():
        raise SystemExit(f"{surgical}: an unfinished stand-in (its build stopped); run surgical_stand_in.py again")
    path = surgical / "stand_in.json"
    return json.loads(path.read_text()) if path.exists() else None


def data_label(record: dict[str, Any] | None) -> dict[str, Any]:
    """How the row's data was made, with the factors that scale the timed work up to the papers' frames."""
    if record is None:
        return {"data": "the pipeline's surgical data", "fraction": 1.0, "test_fraction": 1.0}
    return {"data": f"SYNTHETIC stand-in at the papers' frame counts (bench/surgical_stand_in.yaml), "
                    f"{record['distinct_frames']} distinct frames a video", "fraction": float(record["fraction"]),
            "test_fraction": float(record["test_fraction"])}


def add_client_args(ap) -> None:
    """The options naming one client of a YOLO export: ``--surgical-dir``, ``--group``, ``--setting``, ``--client``."""
    ap.add_argument("--surgical-dir", type=Path, required=True, help="holds yolo/<group>/<setting>/manifest.json")
    ap.add_argument("--group", default="combined")
    ap.add_argument("--setting", default="a")
    ap.add_argument("--client", type=int, default=0)


def export_manifest(surgical: Path, group: str, setting: str) -> Path:
    """The YOLO export's manifest of one group and setting, or an exit that says how to make one."""
    manifest = surgical / "yolo" / group / setting / "manifest.json"
    if not manifest.is_file():
        raise SystemExit(f"{manifest}: no YOLO export there (build it, or a stand-in: bench/surgical_stand_in.py)")
    return manifest


def client_manifest(args) -> Path:
    """The export's manifest that :func:`add_client_args`' options name, or an exit naming ``--client`` where the
    export has no such client (else a traceback after the export is staged)."""
    manifest = export_manifest(args.surgical_dir, args.group, args.setting)
    clients = [int(c["client"]) for c in json.loads(manifest.read_text()).get("clients", [])]
    if args.client not in clients:
        raise SystemExit(f"--client {args.client}: not a client of {manifest} ({', '.join(map(str, clients))})")
    return manifest


@contextmanager
def epoch_clock() -> Iterator[list[dict[str, Any]]]:
    """Time every local YOLO training: ``[{"start": s, "epoch_ends": [s, ...]}, ...]`` (perf_counter seconds).

    A training starts when ``train_yolo`` makes its epoch selector (just before Ultralytics' trainer is
    built) and each epoch ends at the selector's call (``on_fit_epoch_end``, after that epoch's validation).
    """
    calls: list[dict[str, Any]] = []
    init, call = yolo.EpochSelector.__init__, yolo.EpochSelector.__call__

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if calls and not calls[-1]["epoch_ends"]:  # train_yolo first makes one only to check its arguments
            calls[-1]["start"] = time.perf_counter()
        else:
            calls.append({"start": time.perf_counter(), "epoch_ends": []})

    def timed_call(self, trainer):
        call(self, trainer)
        calls[-1]["epoch_ends"].append(time.perf_counter())
        ends = calls[-1]["epoch_ends"]
        progress(f"local training {len(calls)}: epoch {len(ends)} ended {ends[-1] - calls[-1]['start']:.1f} s "
                 "after its start")

    yolo.EpochSelector.__init__, yolo.EpochSelector.__call__ = timed_init, timed_call
    try:
        yield calls
    finally:
        yolo.EpochSelector.__init__, yolo.EpochSelector.__call__ = init, call


@contextmanager
def steps_clock() -> Iterator[list[float]]:
    """Log each local segmentation training with its steps and seconds as it ends; yields the seconds of each.

    It sees the ``train_steps`` calls that look the function up when they run (FedAvg and the FedST
    methods: a site's round, the sites' synthetic fine-tuning); FedRep, FedDP and FedLD bind it at import."""
    from fedmedbench.fl.tasks import segmentation

    seconds: list[float] = []
    inner = segmentation.train_steps

    def timed(model, data, steps, *args, **kwargs):
        t0 = time.perf_counter()
        out = inner(model, data, steps, *args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        progress(f"local training {len(seconds)}: {steps} steps on {data.source} in {seconds[-1]:.1f} s "
                 f"({1000 * seconds[-1] / max(1, steps):.0f} ms a step)")
        return out

    segmentation.train_steps = timed
    try:
        yield seconds
    finally:
        segmentation.train_steps = inner


def split_trainings(calls: list[dict[str, Any]]) -> tuple[float, float]:
    """(set-up s, one epoch's s) of a client's local training, means over the trainings that ran at least
    two epochs: an epoch = the mean gap between epoch ends, set-up = the first epoch's end minus one epoch (0 where
    the epochs varied by more than the set-up took: a first epoch faster than a later one on a busy machine)."""
    timed = [c for c in calls if len(c["epoch_ends"]) >= 2]
    if not timed:
        raise ValueError("no local training ran two epochs: time at least 2 (--surgical-epochs)")
    epochs = [float(np.mean(np.diff(c["epoch_ends"]))) for c in timed]
    setups = [c["epoch_ends"][0] - c["start"] - e for c, e in zip(timed, epochs, strict=True)]
    return max(0.0, float(np.mean(setups))), float(np.mean(epochs))


def evaluations(rounds: int, every: int) -> int:
    """Evaluated rounds of a job: every ``every``-th round and the last one."""
    every = max(1, int(every))
    return rounds // every + (1 if rounds % every else 0)


def split_rounds(per_round: list[float]) -> tuple[float, float, str]:
    """(training s/round, one evaluation's s, how) from per-round times whose last round alone evaluated."""
    if len(per_round) >= 3:
        train = float(np.mean(per_round[1:-1]))
        return train, max(0.0, per_round[-1] - train), "rounds 2..R-1 train only; round R adds the evaluation"
    return float(per_round[-1]), 0.0, "fewer than 3 rounds: the evaluation is not split out"


def _missing(path: Path, target: Path, study: str, config_path: Path) -> SystemExit:
    return SystemExit(f"{study}: {path} is missing; build the study's surgical data first: "
                      f"snakemake --cores N {target} --configfile {config_path}")


def image_cache_of(config: dict, image_cache: str | None) -> str | None:
    """The decoded-frame folder a timing reads: ``image_cache``, else the config's ``engine.image_cache`` ("": none)."""
    return (config["engine"].get("image_cache") if image_cache is None else image_cache) or None


def fedst_timed_config(cfg: dict, rounds: int, fraction: float, steps: int | None = None) -> dict:
    """The fedst block a timing runs: ``rounds`` rounds evaluated after the last, no weight files (the cost is the
    same), and the clip cache scaled by the stand-in's ``fraction`` of the training clips, so that it holds the
    same share of the clips the steps draw from as in the paper grid (its hits are what a step saves). ``steps``:
    that many local steps a round instead of the config's, and FedST's server steps (SERQ) cut by the same share
    (:func:`steps_share`: a round's training scaled back up by it)."""
    cache_mb = max(1, round(int(cfg["data"]["cache_mb"]) * fraction))
    train, serq = {**cfg["train"], "rounds": rounds}, dict(cfg["serq"])
    if steps is not None:
        share = steps_share(cfg, steps)
        train["local_steps"] = steps
        serq["steps"] = max(1, round(int(serq["steps"]) * share))
    return {**cfg, "model": {**cfg["model"], "encoder_weights": None}, "data": {**cfg["data"], "cache_mb": cache_mb},
            "indicator": {**cfg["indicator"], "clip_weights": None,
                          "kind": "onehot" if cfg["indicator"]["kind"] == "clip" else cfg["indicator"]["kind"]},
            "train": train, "serq": serq, "eval": {**cfg["eval"], "eval_every": rounds}}


def steps_share(cfg: dict, steps: int | None) -> float:
    """The share of a main round's local steps a timed round of ``steps`` takes (1: the config's)."""
    main = cfg["train"].get("local_steps")
    if steps is None or not main:
        return 1.0
    if not 1 <= steps <= int(main):
        raise SystemExit(f"fedst: --surgical-steps {steps}: give 1 to the config's {main} local steps a round")
    return steps / int(main)


def fedst_job(timed_cfg: dict, clips: Path, method: str, run_dir: Path, device: str, threads: int, workers: int,
              image_cache: str | None) -> RunSpec:
    """One fedst job (the main variant, seed 0) of ``fedst_timed_config``'s block on the clips in ``clips``."""
    from fedmedbench.studies.fedst import runs as FS

    d = FS.run_spec(timed_cfg, "main", method, 0, str(clips), str(run_dir), None, device, threads, "timing")
    return RunSpec.from_dict({**d, "loader_workers": workers, "image_cache": image_cache})


def fedst_cost(config: dict, config_path: Path, methods: list[str] | None, rounds: int, device: str, threads: int,
               workdir: Path, surgical: Path, workers: int | None = None, image_cache: str | None = None,
               steps: int | None = None) -> dict[str, Any]:
    """``workers``: threads decoding clips ahead of use (default: the config's ``engine.loader_workers``);
    ``image_cache``: the decoded clips kept in this folder (``engine.image_cache``; default: the config's; "": none);
    ``steps``: local steps a timed round (:func:`fedst_timed_config`; default: the config's)."""
    from fedmedbench.studies.fedst import runs as FS

    cfg = config["fedst"]
    clips = surgical / "clips"
    if not (clips / "sites.json").exists():
        raise _missing(clips / "sites.json", clips, "fedst", config_path)
    label = data_label(stand_in(surgical))
    share = steps_share(cfg, steps)
    timed_cfg = fedst_timed_config(cfg, rounds, label["fraction"], steps)
    cache_mb = timed_cfg["data"]["cache_mb"]
    main_steps = FS.train_config(cfg, "main")[1]
    timed = timed_names("fedst", list(cfg["methods"]), methods)
    rates: dict[str, tuple[float, float]] = {}
    workers = int(config["engine"].get("loader_workers", 0) if workers is None else workers)
    image_cache = image_cache_of(config, image_cache)
    row: dict[str, Any] = {"bench": "grid_cost", "study": "fedst", "device": device, "surgical_dir": str(surgical),
                           **label, "loader_workers": workers, "cache_mb": cache_mb, "image_cache": bool(image_cache)}
    pre_s = 0.0
    if cfg["pretrain"].get("enabled", True):  # first: a few steps, so a failure costs no method's timing
        per_step = pretrain_step_s(timed_cfg, str(clips), device, workdir, workers=workers,  # no weight files, as the jobs
                                   image_cache=image_cache)
        pre_s = per_step * int(cfg["pretrain"]["steps"]) * len(cfg["seeds"])
        row["pretrain_s_per_step"] = round(per_step, 4)
    for method in timed:
        spec = fedst_job(timed_cfg, clips, method, workdir / f"fedst-{method}", device, threads, workers, image_cache)
        with steps_clock():
            train_s, eval_s, how = split_rounds(time_spec(spec))
        rates[method] = (train_s / share, eval_s / label["test_fraction"])  # training is a fixed number of steps
        row["split"] = how
    mean = tuple(float(np.mean([r[i] for r in rates.values()])) for i in (0, 1))
    jobs = FS.runs(cfg)
    seconds = 0.0
    for variant, method, _seed in jobs:
        train, steps = FS.train_config(cfg, variant)
        train_s, eval_s = rates.get(method, mean)
        scale = steps / main_steps if steps and main_steps else 1.0  # comm<k>: k iterations; synmix: twice
        seconds += int(train["rounds"]) * train_s * scale + evaluations(int(train["rounds"]), cfg["eval"]["eval_every"]) * eval_s
    sites = len(cfg["sites"]) if "sites" in cfg else len(config["surgical"]["sites"])
    train_samples = float(sites * main_steps * int(cfg["train"]["batch_size"]))  # clips a main round trains on
    forward = fedst_forward_flops(cfg, timed[0])
    row.update(forward_flops_per_sample=forward, train_samples_per_round=train_samples, eval_samples_per_round=0.0,
               flops_per_round=round_flops(forward, train_samples, 0.0),
               measured_s_per_round=round(float(np.mean([r[0] for r in rates.values()])), 3),
               floor_counts="a main round's local training only (its measured seconds too; the clips of the federated "
                            "sites, server steps and evaluation not counted)")
    row.update(jobs=len(jobs), job_rounds=sum(int(FS.train_config(cfg, v)[0]["rounds"]) for v, _, _ in jobs),
               rounds_timed=rounds, local_steps=main_steps, input_size=cfg["data"]["input_size"],
               train_s_per_round={k: round(v[0], 3) for k, v in rates.items()},
               eval_s={k: round(v[1], 3) for k, v in rates.items()},
               untimed_methods_at_mean=sorted(set(cfg["methods"]) - set(rates)),
               timed={"datasets": [label["data"]], "settings": ["main"], "methods": list(rates),
                      "pairs": {"main": list(rates)}, "rounds": rounds, "steady_rounds": max(1, rounds - 2),
                      "evaluations": 1 if rounds >= 3 else 0},
               costing="each job: its method's training seconds a round (rounds 2..R-1, scaled to the config's "
                       "local steps) x its rounds, plus one "
                       "evaluation's seconds (round R less a training round, / test_fraction) x its evaluations; "
                       "variants scaled by their local steps; pre-training at its timed steps"
                       + (f"; {', '.join(sorted(set(cfg['methods']) - set(rates)))} not timed: at the mean of "
                          f"{', '.join(rates)}" if set(cfg["methods"]) - set(rates) else "; every method timed"),
               variants_scaled_by_local_steps=True, pretrain_jobs=len(cfg["seeds"]) if pre_s else 0,
               not_costed="each job's deployment evaluation (out-of-federation site, unseen set, FPS)",
               local_steps_timed=int(timed_cfg["train"].get("local_steps") or 0),
               scaled="an evaluation by 1 / test_fraction (training runs a fixed number of steps)"
                      + (f"; a round's training by {1 / share:g} (its {timed_cfg['train']['local_steps']} local and "
                         f"{timed_cfg['serq']['steps']} server steps timed)" if share != 1 else ""),
               device_seconds=round(seconds + pre_s), device_hours=round((seconds + pre_s) / 3600, 1))
    return row


def pretrain_step_s(cfg: dict, clips: str, device: str, workdir: Path, steps: int = 5, workers: int = 0,
                    image_cache: str | None = None) -> float:
    """Seconds per synthetic pre-training step (the training time the pre-trained file records)."""
    from fedmedbench.studies.fedst import runs as FS
    from fedmedbench.studies.fedst.pretrain import pretrain

    params = {**FS.pretrain_params(cfg, clips), "steps": steps, "enabled": True}
    params["indicator"] = {**params["indicator"], "kind": "onehot"} if params["indicator"]["kind"] == "clip" else params["indicator"]
    out = workdir / "pretrained.pt"
    pretrain(params, 0, out, device, log=lambda m: None, loader_workers=workers, image_cache=image_cache)
    return float(torch.load(out, weights_only=True)["_pretrain_s"]) / steps


def timed_epochs(config: dict, asked: int) -> int:
    """ultraflwr's local epochs a timed round: at least 2 (the first epoch is timed apart), at most the config's."""
    return max(2, min(int(asked), int(config["ultraflwr"]["train"]["epochs"])))


def ultraflwr_job(config: dict, surgical: Path, group: str, setting: str, strategy: str, rounds: int, epochs: int,
                  device: str, threads: int, run_dir: Path, train_workers: int, loader_workers: int,
                  image_cache: str | None) -> RunSpec:
    """One ultraflwr job of the paper configuration, cut to ``rounds`` rounds of ``epochs`` local epochs, evaluated
    after its last round, on the exports in ``surgical``."""
    from fedmedbench.studies.ultraflwr import runs as UFR

    uf = config["ultraflwr"]
    timed_uf = {**uf, "train": {**uf["train"], "rounds": rounds, "epochs": epochs, "workers": train_workers},
                "eval": {**uf["eval"], "every": rounds}}
    r = {"ugroup": group, "usetting": setting, "strategy": strategy, "seedset": uf["seed_sets"][0]}
    d = {**UFR.run_spec(timed_uf, r, str(surgical), None, device, "timing"), "run_dir": str(run_dir),
         "threads": threads, "loader_workers": loader_workers, "image_cache": image_cache}
    return RunSpec.from_dict(d)


def ultraflwr_cost(config: dict, config_path: Path, methods: list[str] | None, rounds: int, device: str, threads: int,
                   workdir: Path, surgical: Path, epochs: int = 2, workers: int | None = None,
                   image_cache: str | None = None, loader_workers: int | None = None) -> dict[str, Any]:
    """``workers``: the local trainings' and the evaluation's dataloader workers (default: the config's
    ``ultraflwr.train.workers`` and ``engine.loader_workers``); ``loader_workers``: ``engine.loader_workers``
    alone (the evaluation's workers, and the training batches read ahead in a thread from 1: the same results);
    ``image_cache``: the decoded-frame folder (``engine.image_cache``; default: the config's; "": none)."""
    from fedmedbench.studies.ultraflwr import runs as UFR

    uf = config["ultraflwr"]
    paper_epochs = int(uf["train"]["epochs"])
    epochs = timed_epochs(config, epochs)
    train_workers = int(uf["train"].get("workers", 0) if workers is None else workers)
    if loader_workers is None:
        loader_workers = int(config["engine"].get("loader_workers", 0) if workers is None else workers)
    image_cache = image_cache_of(config, image_cache)
    strategies = timed_names("ultraflwr", list(uf["strategies"]), methods)
    label = data_label(stand_in(surgical))
    row: dict[str, Any] = {"bench": "grid_cost", "study": "ultraflwr", "device": device, "surgical_dir": str(surgical),
                           **label}
    rates: dict[str, dict[str, tuple[float, float]]] = {}
    parts: dict[str, dict[str, dict[str, float]]] = {}
    for group, settings in uf["groups"].items():  # groups differ in datasets and sizes: each timed on its first setting
        manifest = surgical / "yolo" / group / settings[0] / "manifest.json"
        if not manifest.exists():
            raise _missing(manifest, surgical / "yolo" / group, "ultraflwr", config_path)
        for strategy in strategies:
            spec = ultraflwr_job(config, surgical, group, settings[0], strategy, rounds, epochs, device, threads,
                                 workdir / f"uf-{group}-{strategy}", train_workers, loader_workers, image_cache)
            with epoch_clock() as calls:
                per_round = time_spec(spec)
            train_s, eval_s, how = split_rounds(per_round)
            round_rates = paper_round(train_s, calls, len(per_round), epochs, paper_epochs, label["fraction"])
            rates.setdefault(group, {})[strategy] = (round_rates["train_s"], eval_s / label["test_fraction"])
            parts.setdefault(group, {})[strategy] = {k: round(v, 3) for k, v in round_rates.items()}
            row["split"] = how
    jobs = list(UFR.runs(uf))
    n_rounds, every = int(uf["train"]["rounds"]), int(uf["eval"]["every"])
    seconds = train_seconds = 0.0
    frames = {g: sum(int(c["counts"]["train"]["frames"]) for c in
                     read_manifest(surgical / "yolo" / g / s[0] / "manifest.json")["clients"]) / label["fraction"]
              for g, s in uf["groups"].items()}  # a round's training frames at the papers' counts, per group
    for job in jobs:
        group_rates = rates[job["ugroup"]]
        mean = tuple(float(np.mean([v[i] for v in group_rates.values()])) for i in (0, 1))
        train_s, eval_s = group_rates.get(job["strategy"], mean)
        seconds += n_rounds * train_s + evaluations(n_rounds, every) * eval_s
        train_seconds += n_rounds * train_s
    classes = len(read_manifest(surgical / "yolo" / next(iter(uf["groups"])) / next(iter(uf["groups"].values()))[0]
                                / "manifest.json")["classes"])
    forward = yolo_forward_flops(uf["model"]["cfg"], classes,
                                 int(uf["train"]["imgsz"]))
    train_samples = float(np.mean([paper_epochs * frames[j["ugroup"]] for j in jobs]))
    row.update(forward_flops_per_sample=forward, train_samples_per_round=round(train_samples, 1),
               eval_samples_per_round=0.0, flops_per_round=round_flops(forward, train_samples, 0.0),
               measured_s_per_round=round(train_seconds / (len(jobs) * n_rounds), 3),
               floor_counts="a round's local training only (its measured seconds too): evaluation not counted")
    row.update(jobs=len(jobs), job_rounds=len(jobs) * n_rounds, rounds_timed=rounds, imgsz=uf["train"]["imgsz"],
               local_epochs=paper_epochs, local_epochs_timed=epochs, round_parts=parts,
               train_workers=train_workers, loader_workers=loader_workers, image_cache=bool(image_cache),
               read_ahead=loader_workers >= 1 and train_workers == 0,
               train_s_per_round={g: {k: round(v[0], 3) for k, v in r.items()} for g, r in rates.items()},
               eval_s={g: {k: round(v[1], 3) for k, v in r.items()} for g, r in rates.items()},
               untimed_strategies_at_mean=sorted(set(UFR.strategies(uf)) - set(strategies)),
               timed={"datasets": list(uf["groups"]), "settings": [f"{g}/{ss[0]}" for g, ss in uf["groups"].items()],
                      "methods": strategies, "pairs": {f"{g}/{ss[0]}": strategies for g, ss in uf["groups"].items()},
                      "rounds": rounds, "steady_rounds": max(1, rounds - 2), "local_epochs": epochs},
               costing=f"each job: its group's strategy's round (set-up + {paper_epochs} x a timed epoch / fraction) x "
                       f"{n_rounds} rounds, plus an evaluation (/ test_fraction) x its evaluations; every setting of a "
                       "group at its first setting's rate"
                       + (f"; {', '.join(sorted(set(UFR.strategies(uf)) - set(strategies)))} not timed: at the mean "
                          f"of {', '.join(strategies)}" if set(UFR.strategies(uf)) - set(strategies)
                          else "; every strategy timed"),
               scaled=f"a round = set-up + {paper_epochs} x epoch / fraction, an evaluation / test_fraction; "
                      "mosaic stays on in every timed epoch (the paper's last close_mosaic epochs load faster)",
               device_seconds=round(seconds), device_hours=round(seconds / 3600, 1))
    return row


def yolo_forward_flops(cfg: str, classes: int, imgsz: int) -> int:
    """FLOPs of one ``imgsz`` image's forward pass through the study's YOLO (``build_yolo``, random init)."""
    return forward_flops(yolo.build_yolo(cfg, classes, seed=0), torch.zeros(1, 3, imgsz, imgsz))


def fedst_forward_flops(cfg: dict, method: str) -> int:
    """FLOPs of one clip's forward pass through FedST's network as ``method``'s jobs build it (random init)."""
    from fedmedbench.models.fedst.net import build_fedst_net
    from fedmedbench.studies.fedst import runs as FS

    model_cfg = {**FS.model_config(cfg, "main", method), "encoder_weights": None}
    torch.manual_seed(0)
    net = build_fedst_net(model_cfg)
    h, w = cfg["data"]["input_size"]
    return forward_flops(net, torch.zeros(1, len(cfg["model"]["pools"]), 3, int(h), int(w)))


def paper_round(train_s: float, calls: list[dict[str, Any]], n_rounds: int, epochs: int, paper_epochs: int,
                fraction: float) -> dict[str, float]:
    """One paper round's training seconds from a timed one: the timed round's seconds less its epochs
    (``overhead_s``: each client's trainer set-up, aggregation, messages) plus ``paper_epochs`` epochs scaled
    to all frames. ``calls`` are the job's local trainings in order (as many per round)."""
    per_round = len(calls) // max(1, n_rounds)
    later = calls[per_round:] if n_rounds > 1 else calls  # the first round builds caches, as in train_s
    setup_s, epoch_s = split_trainings(later)
    round_epoch_s = epoch_s * per_round  # the clients train one after another
    overhead_s = max(0.0, train_s - epochs * round_epoch_s)
    return {"train_s": overhead_s + paper_epochs * round_epoch_s / fraction, "overhead_s": overhead_s,
            "client_setup_s": setup_s, "client_epoch_s": epoch_s, "clients": float(per_round)}
