"""The ATen ops one steady round of a study's paper workload dispatches on the CPU (each one or more kernel
launches on a GPU, where the earlystop round is launch-bound: issue 'fewer, bigger kernels').

earlystop: the paper grid's FedAvg job (``config/studies/earlystop.yaml``: ConvNeXtV2-nano, 100 clients of
DermaMNIST at its official split sizes split by Dirichlet 0.1 (``--setting``: another of the study's settings, with
the study's partition draws), 10 clients a round, the study's local epochs, batch
and evaluation batch, evaluation every round) run through the engine on its GPU path (device arrays and
device-cached client data, here on the CPU, as ``host_overhead.py`` runs it). Round 1 (set-up, first use) is a
warm-up; the non-view ops of round 2 are counted with a ``TorchDispatchMode`` and split into local training,
evaluation and the rest. Scaled down where that leaves the count as it is: the model's stage widths (``--width``,
the same layers and tensors, thinner) and the image side (``--image-size``; the same ops on smaller arrays); the
clients, their sizes, the batches and the evaluation sets are the paper's. Ops in the checkpoint's background
thread (serialisation, file writes) are not counted: a dispatch mode is per thread.

    python bench/ops_per_round.py --study earlystop [--method fedavg] [--setting qty1.0] [--[no-]batch-clients]
        [--out bench/results.jsonl]

The last line printed is ``ops_per_round: N``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import engine_overhead as eo  # noqa: E402
import host_overhead as ho  # noqa: E402
from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402

from fedmedbench.compat import limit_threads  # noqa: E402
from fedmedbench.fl.api import method_params  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402

#: studies this bench can run (the classification studies whose workload engine_overhead builds)
STUDIES = ("earlystop",)
#: the setting counted unless ``--setting`` names another (the figures of docs/benchmarks.md are of it)
DEFAULT_SETTING = "dir0.1"


def count_round(study: str, method: str, config: Path, width: int | None, image_size: int, threads: int,
                workdir: Path, batch_clients: bool | None = None, setting_name: str = DEFAULT_SETTING) -> dict:
    """The ops of round 2 of the study's paper job (round 1 a warm-up), per phase."""
    train, model = eo.study_train(config, study)  # first: a missing config or study is one line
    st = yaml.safe_load(config.read_text())["studies"][study]
    if method not in st["methods"]:
        raise SystemExit(f"ops_per_round: --method {method}: not one of {config}'s studies.{study}.methods "
                         f"({', '.join(st['methods'])})")
    if setting_name not in st["settings"]:
        raise SystemExit(f"ops_per_round: --setting {setting_name}: not one of {config}'s studies.{study}.settings "
                         f"({', '.join(st['settings'])})")
    setting = st["settings"][setting_name]
    npz, part = eo.make_data(workdir, int(setting["num_clients"]), image_size=image_size)
    draws = st.get("random_draws", "project")
    if setting_name != DEFAULT_SETTING:  # the setting's own partition of the same data, with the study's draws
        arrays = np.load(npz)
        labels = {s: arrays[f"{s}_labels"].reshape(-1) for s in ("train", "val", "test")}
        io.write_json(part, P.build_partition(labels, setting["scheme"], int(setting["num_clients"]), 0,
                                              setting.get("params", {}), num_classes=7, draws=draws))
    if batch_clients is not None:  # else the config's
        train = {**train, "batch_clients": batch_clients}
    spec = eo.make_spec(workdir, npz, part, model, 2, int(st["clients_per_round"]), threads, "inline",
                        float(st["train"]["local_epochs"]), "cpu", 1, train, image_size)
    spec = dataclasses.replace(spec, method=method, setting=setting_name,
                               method_params=method_params.resolve(method, st["method_params"], setting),
                               random_draws=draws if setting_name != DEFAULT_SETTING else spec.random_draws)
    undo = [ho.as_on_a_gpu(), ho.thin_timm(width)]
    try:
        _, phases, _ = ho.side_run("engine", spec, count=True)
    finally:
        for u in reversed(undo):
            u()
    per_phase, other = phases.steady_ops(2)
    if not (per_phase["train"] and per_phase["eval"]):  # a renamed function would silently count as "other"
        raise SystemExit(f"no ops counted in local training or evaluation ({per_phase}): the functions this bench "
                         "wraps were not called")
    return {"bench": "ops_per_round", "study": study, "method": method, "setting": setting_name, "code": git_head(),
            "model": model,
            "width": width or ho.NANO_DIMS[0], "image_size": image_size, "clients": int(setting["num_clients"]),
            "clients_per_round": int(st["clients_per_round"]), "local_epochs": float(st["train"]["local_epochs"]),
            "batch_size": int(train["batch_size"]), "batch_clients": bool(train.get("batch_clients")), "ops": {p: round(n) for p, n in per_phase.items()},
            "other_top": {k: round(n) for k, n in list(other.items())[:8]},
            "ops_per_round": round(sum(per_phase.values()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="earlystop", choices=STUDIES)
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--setting", default=DEFAULT_SETTING, help="the study's setting whose partition the clients hold "
                    f"(default {DEFAULT_SETTING})")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "studies" / "earlystop.yaml")
    ap.add_argument("--width", type=int, default=8, help="first stage width of the thin model (0: the real one)")
    ap.add_argument("--image-size", type=positive, default=32)
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--batch-clients", action=argparse.BooleanOptionalAction, default=None,
                    help="train.batch_clients: the round's clients together, or not (default: the config's)")
    ap.add_argument("--out", type=Path, help="append the result as one JSON line")
    args = ap.parse_args()
    if args.width < 0:  # a negative stage width fails deep in the model build
        ap.error(f"argument --width: {args.width}: give 0 (the real model) or a width from 1")
    limit_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fmb-ops-") as tmp:
        row = count_round(args.study, args.method, args.config, args.width or None, args.image_size, args.threads,
                          Path(tmp), args.batch_clients, args.setting)
    emit([row], args.out)
    for phase, n in row["ops"].items():
        print(f"{phase}: {n}")
    print(f"ops_per_round: {row['ops_per_round']}")


if __name__ == "__main__":
    main()
