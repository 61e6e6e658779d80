"""The UltraFlwr study's runs (group x setting x strategy x seed set), each run's RunSpec from the
``ultraflwr`` config block, the outputs rule all asks for, and the block's cross-checks."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fedmedbench.config.check import config_error

#: where the study writes
DIR = "results/ultraflwr"


def check_config(uf: dict[str, Any], surgical: dict[str, Any]) -> None:
    """Groups and settings must be surgical ones; top_k at most the number of strategies."""
    for g, settings in uf["groups"].items():
        if g not in surgical["groups"]:
            config_error(f"ultraflwr.groups.{g}", f"not a surgical group (defined: {sorted(surgical['groups'])})")
        for s in settings:
            if s not in surgical["groups"][g]["settings"]:
                config_error(f"ultraflwr.groups.{g}", f"'{s}' is not a setting of surgical group '{g}'")
    # strategy names are checked by the schema's pattern
    if uf["report"]["top_k"] > max(1, len(uf["strategies"])):
        config_error("ultraflwr.report.top_k", f"exceeds the number of strategies ({len(uf['strategies'])})")


def strategies(uf: dict[str, Any]) -> list[str]:
    return list(uf["strategies"]) + (["Centralized"] if uf["centralized"] else [])


def runs(uf: dict[str, Any], group: str | None = None) -> Iterator[dict[str, Any]]:
    for g, settings in uf["groups"].items():
        if group is not None and g != group:
            continue
        for s in settings:
            for strategy in strategies(uf):
                for seedset in uf["seed_sets"]:
                    yield dict(ugroup=g, usetting=s, strategy=strategy, seedset=seedset)


def run_dir(r: Mapping[str, Any]) -> str:
    return f"{DIR}/{r['ugroup']}/{r['usetting']}/{r['strategy']}/seed{r['seedset']}"


def start_weights(uf: dict[str, Any], strategy: str, pretrained_path: str | None) -> str | None:
    """The weights a run starts from: ``model.start: all`` every run (UltraFlwr main), ``centralized`` the
    centralized baseline only (its later branch builds the federated models from the yaml)."""
    return pretrained_path if uf["model"].get("start", "all") == "all" or strategy == "Centralized" else None


def run_spec(uf: dict[str, Any], r: Mapping[str, Any], surgical_dir: str, pretrained_path: str | None, device: str,
             origin: str) -> dict[str, Any]:
    """The resolved RunSpec of one run: every hyper-parameter, so a change reruns exactly its jobs."""
    t = uf["train"]
    return {
        "run_dir": run_dir(r),
        "study": "ultraflwr",
        "dataset": r["ugroup"],
        "setting": r["usetting"],
        "method": "ultraflwr",
        "seed": int(r["seedset"]),
        "partition_path": f"{surgical_dir}/yolo/{r['ugroup']}/{r['usetting']}/manifest.json",
        "sources": {},
        "image_size": t["imgsz"],
        "model": uf["model"]["cfg"],
        "pretrained_path": start_weights(uf, r["strategy"], pretrained_path),
        "train": {"rounds": t["rounds"], "local_epochs": t["epochs"], "batch_size": t["batch"], "lr": t["lr0"]},
        "method_params": {
            "strategy": "FedAvg" if r["strategy"] == "Centralized" else r["strategy"],
            "split": t["split"], "select": t["select"], "select_metric": t["select_metric"],
            "weighting": t["weighting"], "final_aggregation": t["final_aggregation"],
            "auto_optimizer": t["auto_optimizer"], "warmup": t["warmup"],
            "assigner": t["assigner"], "hsv": t["hsv"], "ap": t["ap"], "match": t["match"], "pipeline": t["pipeline"],
            "head_init": uf["model"]["head_init"],
            "ultralytics": {"lr0": t["lr0"], "patience": t["patience"], **t["ultralytics"]},
            **({"workers": int(t["workers"])} if t.get("workers") else {}),  # 0 (the default) keeps earlier runs' hash
        },
        "device": device,
        "data_origin": origin,
        "eval_every": uf["eval"]["every"],
        "task": "detection",
        "task_params": {"eval_batch": uf["eval"]["batch"], "conf": uf["eval"]["conf"], "iou": uf["eval"]["iou"],
                        "rect": uf["eval"]["rect"], "ap": t["ap"], "match": t["match"]},
    }


def group_index(uf: dict[str, Any], group: str) -> list[dict[str, Any]]:
    """One group's runs with the files its report reads."""
    return [{"setting": r["usetting"], "strategy": r["strategy"], "seed": r["seedset"],
             "clients": f"{run_dir(r)}/client_metrics.csv", "metrics": f"{run_dir(r)}/metrics.csv",
             "comm": f"{run_dir(r)}/comm.csv"}
            for r in runs(uf, group)]


def comm_index(uf: dict[str, Any]) -> list[dict[str, Any]]:
    """Every federated run's communication log (the centralized baseline sends nothing)."""
    return [{"group": r["ugroup"], "setting": r["usetting"], "strategy": r["strategy"], "seed": r["seedset"],
             "comm": f"{run_dir(r)}/comm.csv"} for r in runs(uf) if r["strategy"] != "Centralized"]


def targets(uf: dict[str, Any], tag: str) -> list[str]:
    """Every UltraFlwr output the config asks for (added to rule all)."""
    if not uf["groups"]:
        return []
    exts = ("csv", "md", "tex")
    out = [f"{DIR}/tables/table1_params.{ext}" for ext in exts]
    out += [f"{DIR}/tables/communication{tag}.{ext}" for ext in exts]
    for g in uf["groups"]:
        out += [f"{DIR}/tables/top_strategies_{g}{tag}.{ext}" for ext in exts]
        out += [f"{DIR}/tables/pair_matrix_{g}{tag}.{ext}" for ext in exts]
        out.append(f"{DIR}/figures/figure3_{g}{tag}.png")
    return out
