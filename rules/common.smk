# Config validation (schema with defaults + cross-field checks) and the helpers that
# turn the config into file names, targets and per-run parameters.
from snakemake.utils import validate

SOFTWARE_ENV = "../envs/environment.yaml"

validate(config, "../config/schema.yaml")

ORIGIN = config["data"]["origin"]
#: file-name tag that marks outputs computed from synthetic data
TAG = "_synthetic" if ORIGIN == "synthetic" else ""
ID = "[A-Za-z0-9][A-Za-z0-9_.-]*"

wildcard_constraints:
    study=ID,
    dataset="[a-z]+mnist",
    setting=ID,
    method="[a-z_0-9]+",
    seed=r"\d+",
    size=r"28|64|128|224",
    origin="synthetic|real",
    domain=ID,


def _config_error(key, message):
    raise ValueError(f"config error at '{key}': {message}")


def _check_gpaf_report(sname, study):
    rep = study["report"].get("gpaf")
    if rep is None:
        return
    key = f"studies.{sname}.report.gpaf.tsne.methods"
    for m in rep["tsne"]["methods"]:
        if m not in study["methods"]:
            _config_error(key, f"'{m}' is not one of the study's methods {study['methods']}")
        if m in ("local", "centralized"):
            _config_error(key, f"'{m}' has no federated client models to show")
    if rep["tsne"]["methods"] and not study["save_client_models"]:
        _config_error(f"studies.{sname}.save_client_models", "must be true for the t-SNE of client features (report.gpaf.tsne)")


def _check_config():
    for sname, study in config["studies"].items():
        _check_gpaf_report(sname, study)
        for setname, setting in study["settings"].items():
            key = f"studies.{sname}.settings.{setname}"
            scheme, params = setting["scheme"], setting["params"]
            for ds in setting.get("datasets", []):
                if ds not in study["datasets"]:
                    _config_error(f"{key}.datasets", f"'{ds}' is not one of the study's datasets {study['datasets']}")
            if scheme == "domain":
                domains = params.get("domains") or _config_error(f"{key}.params.domains", "the domain scheme needs a list of domain names")
                for d in domains:
                    if d not in config["domains"]:
                        _config_error(f"{key}.params.domains", f"unknown domain '{d}'; defined under 'domains': {sorted(config['domains'])}")
                if setting["num_clients"] != len(domains):
                    _config_error(f"{key}.num_clients", f"must equal the number of domains ({len(domains)})")
            if scheme == "center" and setting["num_clients"] != 2:
                _config_error(f"{key}.num_clients", "the center scheme has exactly 2 clients")
            cpr = study["clients_per_round"]
            if cpr is not None and cpr > setting["num_clients"]:
                _config_error(f"studies.{sname}.clients_per_round", f"{cpr} exceeds num_clients={setting['num_clients']} of setting '{setname}'")


_check_config()


def study_size(study):
    return config["studies"][study]["size"]


def base_npz(dataset, size):
    if ORIGIN == "synthetic":
        return f"resources/synthetic/{dataset}_{size}.npz"
    return f"resources/medmnist/{dataset}_{size}.npz"


def domain_npz(dataset, size, domain):
    """A domain with no corruption steps is the base file itself (no copy)."""
    if not config["domains"][domain]:
        return base_npz(dataset, size)
    return f"resources/domains/{ORIGIN}/{dataset}_{size}/{domain}.npz"


def setting_sources(study, dataset, setting):
    """Data source name -> npz path for a setting (``base`` or one per domain)."""
    s = config["studies"][study]["settings"][setting]
    size = study_size(study)
    if s["scheme"] == "domain":
        return {d: domain_npz(dataset, size, d) for d in s["params"]["domains"]}
    return {"base": base_npz(dataset, size)}


def setting_datasets(study, setting):
    st = config["studies"][study]
    return st["settings"][setting].get("datasets") or st["datasets"]


def runs(study):
    st = config["studies"][study]
    for setting in st["settings"]:
        for dataset in setting_datasets(study, setting):
            for method in st["methods"]:
                for seed in st["seeds"]:
                    yield dict(study=study, dataset=dataset, setting=setting, method=method, seed=seed)


def run_dir(w):
    return f"results/{w['study']}/{w['dataset']}/{w['setting']}/{w['method']}/seed{w['seed']}"


def partition_json(w):
    return f"resources/partitions/{w['study']}/{w['dataset']}/{w['setting']}/seed{w['seed']}.json"


def run_spec(wildcards):
    """The resolved per-run parameters (a fedmedbench RunSpec as a dict)."""
    w = dict(wildcards)
    st = config["studies"][w["study"]]
    return {
        "run_dir": run_dir(w),
        "study": w["study"],
        "dataset": w["dataset"],
        "setting": w["setting"],
        "method": w["method"],
        "seed": int(w["seed"]),
        "partition_path": partition_json(w),
        "sources": setting_sources(w["study"], w["dataset"], w["setting"]),
        "image_size": st["size"],
        "model": st["model"]["name"],
        "pretrained_path": st["model"]["pretrained_path"],
        "train": {**st["train"], **st["method_train"].get(w["method"], {})},
        "clients_per_round": st["clients_per_round"],
        "method_params": dict(st["method_params"].get(w["method"], {})),
        "device": config["device"],
        "threads": config["threads"]["train"],
        "data_origin": ORIGIN,
        "log_every": st["log_every"],
        "eval_every": st["eval_every"],
        "save_client_models": st["save_client_models"],
    }


def study_summaries(wildcards):
    return [f"{run_dir(r)}/summary.json" for r in runs(wildcards.study)]


def study_metrics(wildcards):
    return [f"{run_dir(r)}/metrics.csv" for r in runs(wildcards.study)]


def all_targets():
    out = []
    for study in config["studies"]:
        out += expand("results/{study}/tables/final_metrics{tag}.{ext}", study=study, tag=TAG, ext=["csv", "md", "tex"])
        out.append(f"results/{study}/figures/convergence{TAG}.png")
        out += gpaf_targets(study)
    return out


def corrupt_input(wildcards):
    """The base file a domain is corrupted from (by the origin wildcard)."""
    if wildcards.origin == "synthetic":
        return f"resources/synthetic/{wildcards.dataset}_{wildcards.size}.npz"
    return f"resources/medmnist/{wildcards.dataset}_{wildcards.size}.npz"


# --- GPAF study report (rules/report_gpaf.smk): Table 1, rounds to target, t-SNE -----------------


def gpaf_targets(study):
    st = config["studies"][study]
    if st["report"].get("gpaf") is None:
        return []
    datasets = sorted({r["dataset"] for r in runs(study)})
    out = expand("results/{study}/tables/table1_{dataset}{tag}.{ext}", study=study, dataset=datasets, tag=TAG,
                 ext=["csv", "md", "tex"])
    out += expand("results/{study}/tables/convergence_rounds{tag}.{ext}", study=study, tag=TAG, ext=["csv", "md"])
    out.append(f"results/{study}/figures/gpaf_convergence{TAG}.png")
    if st["report"]["gpaf"]["tsne"]["methods"]:
        for setting in st["settings"]:
            for dataset in setting_datasets(study, setting):
                out.append(f"results/{study}/figures/tsne_{dataset}_{setting}{TAG}.png")
    return out


def gpaf_dataset_summaries(wildcards):
    return [f"{run_dir(r)}/summary.json" for r in runs(wildcards.study) if r["dataset"] == wildcards.dataset]


def _gpaf_tsne_runs(wildcards):
    st = config["studies"][wildcards.study]
    seed = st["seeds"][0]
    return [dict(study=wildcards.study, dataset=wildcards.dataset, setting=wildcards.setting, method=m, seed=seed)
            for m in st["report"]["gpaf"]["tsne"]["methods"]]


def gpaf_tsne_inputs(wildcards):
    """Each shown method's first-seed run (its summary names client_models.pt), partition and data."""
    files = []
    for r in _gpaf_tsne_runs(wildcards):
        files += [f"{run_dir(r)}/summary.json", f"{run_dir(r)}/model.pt"]
    files.append(partition_json(_gpaf_tsne_runs(wildcards)[0]))
    files += sorted(set(setting_sources(wildcards.study, wildcards.dataset, wildcards.setting).values()))
    return files


def gpaf_tsne_specs(wildcards):
    return {r["method"]: run_spec(r) for r in _gpaf_tsne_runs(wildcards)}
