"""Which outputs the GPAF report adds to a MedMNIST study (``report.gpaf``), and its config checks.

The runs are the study's ordinary ones (rules/common.smk); the report adds Table 1 per dataset,
rounds to a target, the convergence figure, one domain figure per dataset and set of domains,
and the t-SNE of client features for the methods ``report.gpaf.tsne.methods`` lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedmedbench.config.check import config_error


def check_config(sname: str, study: dict[str, Any]) -> None:
    """t-SNE methods must be federated methods of the study that keep client models; a Fig. 5a metric
    measured on the clients (client_val_*) needs the study's client_validation."""
    rep = study["report"].get("gpaf")
    if rep is None:
        return
    key = f"studies.{sname}.report.gpaf.tsne.methods"
    for m in rep["tsne"]["methods"]:
        if m not in study["methods"]:
            config_error(key, f"'{m}' is not one of the study's methods {study['methods']}")
        if m in ("local", "centralized"):
            config_error(key, f"'{m}' has no federated client models to show")
    if rep["tsne"]["methods"] and not study["save_client_models"]:
        config_error(f"studies.{sname}.save_client_models", "must be true for the t-SNE of client features (report.gpaf.tsne)")
    if rep["fig5a_metric"].startswith("client_val_") and not study["client_validation"]:
        config_error(f"studies.{sname}.client_validation", f"must be mean or weighted for report.gpaf.fig5a_metric "
                     f"{rep['fig5a_metric']} (or set fig5a_metric: val_accuracy, the global model)")
    kept = study["client_models_round"]
    if kept is not None and kept > study["train"]["rounds"]:
        config_error(f"studies.{sname}.client_models_round", f"{kept} is after the last round ({study['train']['rounds']})")


def targets(sname: str, study: dict[str, Any], runs: list[dict[str, Any]], setting_datasets: Callable[[str], list[str]],
            tag: str) -> list[str]:
    """Every GPAF output of study ``sname`` (``runs``: its runs; ``setting_datasets``: a setting's datasets)."""
    if study["report"].get("gpaf") is None:
        return []
    datasets = sorted({r["dataset"] for r in runs})
    out = [f"results/{sname}/tables/table1_{d}{tag}.{ext}" for d in datasets for ext in ("csv", "md", "tex")]
    out += [f"results/{sname}/tables/convergence_rounds{tag}.{ext}" for ext in ("csv", "md")]
    out.append(f"results/{sname}/figures/gpaf_convergence{tag}.png")
    seen = set()
    for setting, s in study["settings"].items():  # one domain figure per dataset and set of domains
        if s["scheme"] != "domain":
            continue
        for dataset in setting_datasets(setting):
            key = (dataset, tuple(s["params"]["domains"]))
            if key not in seen:
                seen.add(key)
                out.append(f"results/{sname}/figures/domains_{dataset}_{setting}{tag}.png")
    if study["report"]["gpaf"]["tsne"]["methods"]:
        for setting in study["settings"]:
            for dataset in setting_datasets(setting):
                out.append(f"results/{sname}/figures/tsne_{dataset}_{setting}{tag}.png")
    return out


def tsne_runs(sname: str, study: dict[str, Any], dataset: str, setting: str) -> list[dict[str, Any]]:
    """The runs one t-SNE figure shows: each listed method's first-seed run."""
    seed = study["seeds"][0]
    return [dict(study=sname, dataset=dataset, setting=setting, method=m, seed=seed)
            for m in study["report"]["gpaf"]["tsne"]["methods"]]
