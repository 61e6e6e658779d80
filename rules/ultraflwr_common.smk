# UltraFlwr study (docs/ultraflwr.md): federated YOLO on the surgical YOLO exports, 14 full /
# partial aggregation strategies + the per-client centralized baseline, then Table I (from the
# model), Tables II/III (top strategies per setting), Figure 3 (validation mAP50 per round) and
# the measured communication per client and round.
UF = config["ultraflwr"]
UF_DIR = "results/ultraflwr"


def _check_ultraflwr_config():
    for g, settings in UF["groups"].items():
        if g not in SURGICAL["groups"]:
            _config_error(f"ultraflwr.groups.{g}", f"not a surgical group (defined: {sorted(SURGICAL['groups'])})")
        for s in settings:
            if s not in SURGICAL["groups"][g]["settings"]:
                _config_error(f"ultraflwr.groups.{g}", f"'{s}' is not a setting of surgical group '{g}'")
    # strategy names are checked by the schema's pattern
    if UF["report"]["top_k"] > max(1, len(UF["strategies"])):
        _config_error("ultraflwr.report.top_k", f"exceeds the number of strategies ({len(UF['strategies'])})")


_check_ultraflwr_config()


def ultraflwr_strategies():
    return list(UF["strategies"]) + (["Centralized"] if UF["centralized"] else [])


def ultraflwr_runs(group=None):
    for g, settings in UF["groups"].items():
        if group is not None and g != group:
            continue
        for s in settings:
            for strategy in ultraflwr_strategies():
                for seedset in UF["seed_sets"]:
                    yield dict(ugroup=g, usetting=s, strategy=strategy, seedset=seedset)


def ultraflwr_run_dir(r):
    return f"{UF_DIR}/{r['ugroup']}/{r['usetting']}/{r['strategy']}/seed{r['seedset']}"


def ultraflwr_weights():
    """(weight file, manifests) of the YOLO model: server, every client and the centralized baseline."""
    return model_weights(UF["model"], "ultraflwr.model")


def ultraflwr_spec(wildcards):
    """The resolved RunSpec of one run: every hyper-parameter, so a change reruns exactly its jobs."""
    t = UF["train"]
    return {
        "run_dir": ultraflwr_run_dir(wildcards),
        "study": "ultraflwr",
        "dataset": wildcards.ugroup,
        "setting": wildcards.usetting,
        "method": "ultraflwr",
        "seed": int(wildcards.seedset),
        "partition_path": f"{SURG}/yolo/{wildcards.ugroup}/{wildcards.usetting}/manifest.json",
        "sources": {},
        "image_size": t["imgsz"],
        "model": UF["model"]["cfg"],
        "pretrained_path": ultraflwr_weights()[0],
        "train": {"rounds": t["rounds"], "local_epochs": t["epochs"], "batch_size": t["batch"], "lr": t["lr0"]},
        "method_params": {
            "strategy": "FedAvg" if wildcards.strategy == "Centralized" else wildcards.strategy,
            "split": t["split"], "select": t["select"], "select_metric": t["select_metric"],
            "weighting": t["weighting"], "final_aggregation": t["final_aggregation"],
            "ultralytics": {"lr0": t["lr0"], "patience": t["patience"], **t["ultralytics"]},
        },
        "device": config["device"],
        "data_origin": SORIGIN,
        "eval_every": UF["eval"]["every"],
        "task": "detection",
        "task_params": {"eval_batch": UF["eval"]["batch"], "conf": UF["eval"]["conf"], "iou": UF["eval"]["iou"]},
    }


def ultraflwr_group_runs(wildcards):
    return [r for r in ultraflwr_runs(wildcards.ugroup)]


def ultraflwr_group_inputs(wildcards):
    runs = ultraflwr_group_runs(wildcards)
    return {"clients": [f"{ultraflwr_run_dir(r)}/client_metrics.csv" for r in runs],
            "metrics": [f"{ultraflwr_run_dir(r)}/metrics.csv" for r in runs],
            "comm": [f"{ultraflwr_run_dir(r)}/comm.csv" for r in runs]}


def ultraflwr_group_index(wildcards):
    return [{"setting": r["usetting"], "strategy": r["strategy"], "seed": r["seedset"],
             "clients": f"{ultraflwr_run_dir(r)}/client_metrics.csv", "metrics": f"{ultraflwr_run_dir(r)}/metrics.csv",
             "comm": f"{ultraflwr_run_dir(r)}/comm.csv"}
            for r in ultraflwr_group_runs(wildcards)]


def ultraflwr_comm_index():
    return [{"group": r["ugroup"], "setting": r["usetting"], "strategy": r["strategy"], "seed": r["seedset"],
             "comm": f"{ultraflwr_run_dir(r)}/comm.csv"} for r in ultraflwr_runs() if r["strategy"] != "Centralized"]


def ultraflwr_targets():
    """Every UltraFlwr output the config asks for (added to rule all)."""
    if not UF["groups"]:
        return []
    out = expand(f"{UF_DIR}/tables/table1_params.{{ext}}", ext=["csv", "md", "tex"])
    out += expand(f"{UF_DIR}/tables/communication{STAG}.{{ext}}", ext=["csv", "md", "tex"])
    for g in UF["groups"]:
        out += expand(f"{UF_DIR}/tables/top_strategies_{g}{STAG}.{{ext}}", ext=["csv", "md", "tex"])
        out += expand(f"{UF_DIR}/tables/pair_matrix_{g}{STAG}.{{ext}}", ext=["csv", "md", "tex"])
        out.append(f"{UF_DIR}/figures/figure3_{g}{STAG}.png")
    return out
