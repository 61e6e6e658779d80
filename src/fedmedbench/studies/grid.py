"""The training jobs of a classification study and what each one trains with, from its config block.

One reading for the workflow (rules/common.smk, rules/shared_runs.smk) and for the benchmarks that cost a
grid (bench/grid_cost.py), so a cost is taken on the configuration the grid really runs. Torch-free: the
workflow reads it while it plans.

A run whose inputs do not depend on the setting is trained once: a centralized run (pooled data) in a
setting whose clients together hold every training sample exactly once has the same pooled training set,
global test set, train block and method parameters in every such setting of the same dataset and number
of clients. It trains in the first of those settings (its *home*) and is shown in the others
(:func:`shared_runs`, ``studies.<study>.shared_centralized``). Two things still follow the home
partition: the pooled samples' order (the clients' shares concatenated) and the steps per round (the
federation's mean, from each client's ceil(n_i / batch size)), so a shown run is not bit for bit the run
its own setting would train, and its step count may differ by a few steps per round.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedmedbench.config.check import config_error
from fedmedbench.fl.api import method_params

#: methods trained on the pooled data of all clients as one (``Method.centralized``; checked in tests)
POOLED_METHODS = ("centralized",)
#: partition schemes whose clients together hold every training sample exactly once (NIID-Bench's
#: splits and the FL-Simulator quantity skew): the pooled training set is the whole training split, and the
#: global test set the official test split, whatever the partition draws. The FL-Simulator label skews
#: (``fls``, ``fls_pathological``) repeat samples, ``pathological`` may drop classes, and ``domain``
#: corrupts each sample by its client's domain, so their pooled sets depend on the partition.
COVERING_SCHEMES = ("iid", "dirichlet", "quantity", "fls_quantity")
#: the files a training job writes into its run folder (rules/train.smk), copied for a shown run
RUN_FILES = ("metrics.csv", "client_metrics.csv", "summary.json", "model.pt")


def setting_datasets(study: dict[str, Any], setting: str) -> list[str]:
    """The setting's own dataset list, else the study's."""
    return study["settings"][setting].get("datasets") or study["datasets"]


def runs(study: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every (setting, dataset, method, seed) job of the study, in the workflow's order (a shown run too:
    every setting's table has its row)."""
    for setting in study["settings"]:
        for dataset in setting_datasets(study, setting):
            for method in study["methods"]:
                for seed in study["seeds"]:
                    yield dict(dataset=dataset, setting=setting, method=method, seed=seed)


def trained_runs(study: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs that train: :func:`runs` less those shown from another setting."""
    shown = shared_runs(study)
    return [r for r in runs(study) if (r["dataset"], r["setting"], r["method"]) not in shown]


def _train_blocks(study: dict[str, Any], setting: str, method: str) -> list[tuple[str, dict[str, Any]]]:
    """The train blocks of one (setting, method) pair with their keys, least specific first: the study's
    ``train``, the setting's, the method's (``method_train``), the pair's (``settings.<setting>.method_train``)."""
    s = study["settings"][setting]
    return [("train", study["train"]), (f"settings.{setting}.train", s.get("train", {})),
            (f"method_train.{method}", study["method_train"].get(method, {})),
            (f"settings.{setting}.method_train.{method}", (s.get("method_train") or {}).get(method, {}))]


def run_train(study: dict[str, Any], setting: str, method: str) -> dict[str, Any]:
    """The pair's train blocks merged (:func:`_train_blocks`): the most specific key wins."""
    out: dict[str, Any] = {}
    for _, block in _train_blocks(study, setting, method):
        out.update(block)
    return out


def train_overrides(study: dict[str, Any]) -> dict[str, dict[str, dict[str, list[Any]]]]:
    """setting -> method -> {key: [the pair's value, the study's]} for every train key where the pair's runs
    (:func:`run_train`) differ from the study's ``train``; pairs that train as the study are left out."""
    base = study["train"]
    out: dict[str, dict[str, dict[str, list[Any]]]] = {}
    for setting in study["settings"]:
        for method in study["methods"]:
            diff = {k: [v, base.get(k)] for k, v in run_train(study, setting, method).items() if k not in base or base[k] != v}
            if diff:
                out.setdefault(setting, {})[method] = diff
    return out


def _train_key(study: dict[str, Any], setting: str, method: str, name: str) -> str:
    """Where ``run_train`` reads ``name`` for this pair: the most specific block that sets it."""
    where = [key for key, block in _train_blocks(study, setting, method) if name in block]
    return f"{where[-1] if where else 'train'}.{name}"


def run_model(study: dict[str, Any], method: str) -> dict[str, Any]:
    """The study's model block with the method's override (``method_model``) on top."""
    return {**study["model"], **study["method_model"].get(method, {})}


def run_client_augmentation(study: dict[str, Any], setting: str) -> str:
    """The setting's ``client_augmentation``, else the study's (none | reference | reference_train)."""
    return study["settings"][setting].get("client_augmentation", study.get("client_augmentation", "none"))


def pooled_inputs(study: dict[str, Any], dataset: str, setting: str, method: str) -> str | None:
    """What a pooled-data run of ``method`` in ``setting`` trains on and with, as a key (equal keys: the same
    inputs); None where they depend on the partition (another scheme) or the method is not pooled."""
    s = study["settings"][setting]
    if method not in POOLED_METHODS or s["scheme"] not in COVERING_SCHEMES:
        return None
    return json.dumps({
        "dataset": dataset, "num_clients": s["num_clients"], "train": run_train(study, setting, method),
        "method_params": method_params.resolve(method, study["method_params"], s),
        "client_augmentation": run_client_augmentation(study, setting),
    }, sort_keys=True, default=str)


def shared_runs(study: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """(dataset, setting, method) of each run shown from another setting -> the setting it trains in (the
    first setting, in the study's order, with the same pooled inputs). Empty with ``shared_centralized: false``."""
    if not study.get("shared_centralized", True):
        return {}
    home: dict[str, str] = {}
    shown: dict[tuple[str, str, str], str] = {}
    for setting in study["settings"]:
        for dataset in setting_datasets(study, setting):
            for method in study["methods"]:
                key = pooled_inputs(study, dataset, setting, method)
                if key is None:
                    continue
                if key in home:
                    shown[(dataset, setting, method)] = home[key]
                else:
                    home[key] = setting
    return shown


def check_config(sname: str, study: dict[str, Any]) -> None:
    """A per-(setting, method) override must name one of the study's methods (else it would change nothing);
    seeds side by side share their rounds' batched training, so they need their clients together (no setting's
    or method's override turning ``batch_clients`` off)."""
    if study["train"].get("seeds_together"):
        if not study["train"].get("batch_clients"):
            config_error(f"studies.{sname}.train.seeds_together",
                         "seeds side by side share their rounds' batched training: set train.batch_clients: true too")
        for setting in study["settings"]:
            for method in study["methods"]:
                if not run_train(study, setting, method).get("batch_clients"):
                    config_error(f"studies.{sname}.{_train_key(study, setting, method, 'batch_clients')}",
                                 "train.seeds_together is on: this override would have the seeds only take turns in "
                                 "one job; drop it or set train.seeds_together: false")
    for setting, s in study["settings"].items():
        for method in s.get("method_train") or {}:
            if method not in study["methods"]:
                config_error(f"studies.{sname}.settings.{setting}.method_train.{method}",
                             f"'{method}' is not one of the study's methods {study['methods']}")


def show_run(home_dir: str | Path, out_dir: str | Path, setting: str) -> None:
    """Write a shown run's files from its home run: the same metrics and model, the summary under the shown
    setting with ``trained_in`` naming the home setting (tables list it in the shown setting's rows). Its
    per-client rows (client_metrics.csv) are those of the home setting's clients."""
    from fedmedbench.workflow import io

    home_dir, out_dir = Path(home_dir), Path(out_dir)
    summary = json.loads((home_dir / "summary.json").read_text())
    trained_in = summary.get("trained_in", summary["setting"])
    for name in RUN_FILES:
        if name != "summary.json":
            with io.atomic_path(out_dir / name) as tmp:
                shutil.copyfile(home_dir / name, tmp)
    io.write_json(out_dir / "summary.json", {**summary, "setting": setting, "trained_in": trained_in})
