# Study fedst (FedST, seed 002): synthetic pre-training, one Flower simulation per
# sites/variant/method/seed on the surgical clips, tables II-IX (docs/fedst.md).
# params carry every hyper-parameter of a job, so a change reruns exactly the affected jobs.
import fedmedbench.fedst_study as FS

FEDST = config["fedst"]
FEDST_CLIPS = f"{SURG}/clips"
FEDST_TABLES = ["table2", "table3", "table4", "table5", "table6", "table7", "table8", "table9"]


def _check_fedst_config():
    if not FEDST["enabled"]:
        return
    sites = SURGICAL["sites"]
    for key in ("outfed_site", "unseen_site", "server_site"):
        if FEDST[key] not in sites:
            _config_error(f"fedst.{key}", f"'{FEDST[key]}' is not a surgical.sites entry {sorted(sites)}")
    for s in FEDST["sites"]:
        if s not in sites:
            _config_error("fedst.sites", f"'{s}' is not a surgical.sites entry {sorted(sites)}")
        elif sites[s].get("role", "federated") != "federated":
            _config_error("fedst.sites", f"site '{s}' has role {sites[s]['role']}, not federated")
    m = FEDST["model"]
    if len(m["pools"]) != len(m["fields"]):
        _config_error("fedst.model.fields", f"needs one entry per entry of fedst.model.pools ({len(m['pools'])})")
    if len(m["pools"]) != SURGICAL["clips"]["num_previous"] + 1:
        _config_error("fedst.model.pools", f"needs one entry per clip frame (surgical.clips.num_previous + 1 = "
                      f"{SURGICAL['clips']['num_previous'] + 1})")
    if "ind_clip" in FEDST["variants"] or FEDST["indicator"]["kind"] == "clip":
        if not FEDST["indicator"]["clip_weights"]:
            _config_error("fedst.indicator.clip_weights", "the CLIP indicator (kind clip or variant ind_clip) needs a local "
                          "open_clip state_dict file; or use kind onehot/gaussian/random and drop ind_clip")
    if FEDST["indicator"]["kind"] != "clip" and FEDST["model"]["indicator_dim"] < len(sites):
        _config_error("fedst.model.indicator_dim", f"must be >= the number of sites ({len(sites)}) for one-hot indicators")
    unknown = set(FEDST["method_params"]) - set(FEDST["methods"])
    if unknown:
        _config_error("fedst.method_params", f"{sorted(unknown)} are not among fedst.methods")


_check_fedst_config()


def fedst_run_dir(w):
    return f"results/fedst/{w.sites}/{w.variant}/{w.method}/seed{w.seed}"


def fedst_pretrained(w):
    return f"results/fedst/{w.sites}/pretrain/seed{w.seed}/pretrained.pt" if FEDST["pretrain"]["enabled"] else []


def fedst_spec(w):
    pre = fedst_pretrained(w) or None
    return FS.run_spec(FEDST, w.variant, w.method, int(w.seed), FEDST_CLIPS, fedst_run_dir(w), pre,
                       config["device"], config["threads"]["train"], SORIGIN)


def fedst_run_files(name):
    key = FS.sites_key(FEDST)
    return [f"results/fedst/{key}/{v}/{m}/seed{s}/{name}" for v, m, s in FS.runs(FEDST)]


def fedst_targets():
    """Every fedst output the config asks for (added to rule all)."""
    if not FEDST["enabled"]:
        return []
    return [f"results/fedst/tables/{t}.md" for t in FEDST_TABLES]


wildcard_constraints:
    sites="[A-Za-z0-9]+",
    variant="|".join(["main", *FS.VARIANTS]),


rule fedst_pretrain:
    input:
        clips=FEDST_CLIPS,
    output:
        "results/fedst/{sites}/pretrain/seed{seed}/pretrained.pt",
    params:
        pre=FS.pretrain_params(FEDST, FEDST_CLIPS),
        device=config["device"],
    log:
        "logs/fedst_pretrain/{sites}/seed{seed}.log",
    benchmark:
        "benchmarks/fedst_pretrain/{sites}/seed{seed}.tsv"
    threads: config["threads"]["train"]
    resources:
        mem_mb=FEDST["resources"]["mem_mb"],
        runtime=FEDST["resources"]["runtime_min"],
        gpu=0,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_pretrain.py"


rule fedst_train:
    input:
        clips=FEDST_CLIPS,
        pretrained=fedst_pretrained,
    output:
        metrics="results/fedst/{sites}/{variant}/{method}/seed{seed}/metrics.csv",
        clients="results/fedst/{sites}/{variant}/{method}/seed{seed}/client_metrics.csv",
        summary="results/fedst/{sites}/{variant}/{method}/seed{seed}/summary.json",
        model="results/fedst/{sites}/{variant}/{method}/seed{seed}/model.pt",
        deploy="results/fedst/{sites}/{variant}/{method}/seed{seed}/deploy.json",
    params:
        spec=fedst_spec,
        deploy={"outfed_site": FEDST["outfed_site"], "unseen_site": FEDST["unseen_site"], "fps_clips": FEDST["eval"]["fps_clips"]},
    log:
        "logs/fedst_train/{sites}/{variant}/{method}/seed{seed}.log",
    benchmark:
        "benchmarks/fedst_train/{sites}/{variant}/{method}/seed{seed}.tsv"
    threads: config["threads"]["train"]
    resources:
        mem_mb=FEDST["resources"]["mem_mb"],
        runtime=FEDST["resources"]["runtime_min"],
        gpu=1 if config["device"] == "cuda" else 0,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_train.py"


rule fedst_tables:
    input:
        clients=fedst_run_files("client_metrics.csv"),
        deploy=fedst_run_files("deploy.json"),
        summary=fedst_run_files("summary.json"),
    output:
        md=[f"results/fedst/tables/{t}.md" for t in FEDST_TABLES],
        csv=[f"results/fedst/tables/{t}.csv" for t in FEDST_TABLES],
    params:
        cfg={k: FEDST[k] for k in ("sites", "outfed_site", "unseen_site", "seeds", "methods", "variants", "indicator", "train")},
        origin=SORIGIN,
    log:
        "logs/fedst_tables/tables.log",
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_tables.py"
