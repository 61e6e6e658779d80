"""The training jobs of a classification study and what each one trains with, from its config block.

One reading for the workflow (rules/common.smk) and for the benchmarks that cost a grid
(bench/grid_cost.py), so a cost is taken on the configuration the grid really runs. Torch-free: the
workflow reads it while it plans.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def setting_datasets(study: dict[str, Any], setting: str) -> list[str]:
    """The setting's own dataset list, else the study's."""
    return study["settings"][setting].get("datasets") or study["datasets"]


def runs(study: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every (setting, dataset, method, seed) job of the study, in the workflow's order."""
    for setting in study["settings"]:
        for dataset in setting_datasets(study, setting):
            for method in study["methods"]:
                for seed in study["seeds"]:
                    yield dict(dataset=dataset, setting=setting, method=method, seed=seed)


def run_train(study: dict[str, Any], setting: str, method: str) -> dict[str, Any]:
    """The study's ``train`` block, then the setting's, then the method's (``method_train``)."""
    return {**study["train"], **study["settings"][setting].get("train", {}), **study["method_train"].get(method, {})}


def run_model(study: dict[str, Any], method: str) -> dict[str, Any]:
    """The study's model block with the method's override (``method_model``) on top."""
    return {**study["model"], **study["method_model"].get(method, {})}
