# Config validation (schema with defaults + cross-field checks) and the helpers that
# turn the config into file names, targets and per-run parameters.
import os
import sys
from pathlib import Path

from snakemake.utils import validate

import fedmedbench.data.user as USER
import fedmedbench.studies.earlystop.runs as ES
import fedmedbench.studies.gpaf.runs as GPAF
import fedmedbench.studies.grid as GRID
import fedmedbench.partition as PARTITION
from fedmedbench.configcheck import coerce_numbers, config_error, ignored_settings
from fedmedbench.report.html import table_caption
from fedmedbench.fl import method_params

SOFTWARE_ENV = "../envs/environment.yaml"

# YAML 1.1 reads 5e-2 as text: numbers where the schema asks for one
coerce_numbers(config, Path(workflow.basedir) / "config" / "schema.yaml")
validate(config, "../config/schema.yaml")
for _warning in ignored_settings(config):
    print(f"config warning: {_warning}", file=sys.stderr)

ORIGIN = config["data"]["origin"]
#: the user's own datasets (name -> registry entry); every other dataset name is an official MedMNIST flag
USER_DATASETS = config["datasets"]
#: file-name tag that marks outputs computed from synthetic data
TAG = "_synthetic" if ORIGIN == "synthetic" else ""
ID = "[A-Za-z0-9][A-Za-z0-9_.-]*"

wildcard_constraints:
    study=ID,
    dataset="[a-z][a-z0-9-]*",
    setting=ID,
    method="[a-z_0-9]+",
    seed=r"\d+",
    size=r"28|64|128|224",
    origin="synthetic|real|user",
    domain=ID,
    sdataset=ID,
    sgroup=ID,


def _config_error(key, message):
    config_error(key, message)


OFFICIAL_FLAGS = ("pathmnist", "dermamnist", "octmnist", "pneumoniamnist", "retinamnist", "breastmnist", "bloodmnist",
                  "tissuemnist", "organamnist", "organcmnist", "organsmnist")


def _check_registry():
    for name, entry in USER_DATASETS.items():
        if name in OFFICIAL_FLAGS:
            _config_error(f"datasets.{name}", "is an official MedMNIST flag; give your dataset another name")
        USER.check_registry_entry(name, entry)


def _check_datasets(sname, study):
    for ds in study["datasets"]:
        if ds not in OFFICIAL_FLAGS and ds not in USER_DATASETS:
            _config_error(f"studies.{sname}.datasets", f"'{ds}' is neither an official MedMNIST flag {list(OFFICIAL_FLAGS)} "
                          f"nor registered under 'datasets' {sorted(USER_DATASETS)}")
        if ds in USER_DATASETS and study["size"] not in USER_DATASETS[ds]["sizes"]:
            _config_error(f"studies.{sname}.size", f"{study['size']} px is not one of the sizes of dataset '{ds}' "
                          f"(datasets.{ds}.sizes: {USER_DATASETS[ds]['sizes']})")


def _check_config():
    _check_registry()
    for sname, study in config["studies"].items():
        GPAF.check_config(sname, study)
        _check_datasets(sname, study)
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
        if study["settings"]:
            ES.check_config(sname, study)


_check_config()


def study_size(study):
    return config["studies"][study]["size"]


def user_dataset(dataset):
    """The registry entry of a user dataset; None for an official flag."""
    return USER_DATASETS.get(dataset)


def dataset_origin(dataset, size):
    """Where a dataset's data come from, as tables and captions say it."""
    if dataset in USER_DATASETS:
        return USER.origin_label(USER_DATASETS[dataset], size)
    return ORIGIN


def study_origin(study):
    """The study's data origin for captions: synthetic, real, and/or 'user data: <path>' (joined by '; ')."""
    size = study_size(study)
    names = sorted({r["dataset"] for r in runs(study)})
    parts = [ORIGIN] if any(n not in USER_DATASETS for n in names) else []
    parts += [dataset_origin(n, size) for n in names if n in USER_DATASETS]
    return "; ".join(parts)


def synthetic_params(dataset):
    """The generator's settings for one flag: data.synthetic with that flag's per_dataset overrides."""
    syn = {k: v for k, v in config["data"]["synthetic"].items() if k != "per_dataset"}
    return {**syn, **config["data"]["synthetic"]["per_dataset"].get(dataset, {})}


def base_npz(dataset, size):
    if dataset in USER_DATASETS:
        return f"resources/user/{dataset}_{size}.npz"
    if ORIGIN == "synthetic":
        return f"resources/synthetic/{dataset}_{size}.npz"
    return f"resources/medmnist/{dataset}_{size}.npz"


def verified_marker(dataset, size):
    """Real data: the marker written once the official file's MD5 was checked (rule verify_medmnist),
    however the file got into resources/medmnist/. Every reader depends on it; synthetic and user data have none."""
    if ORIGIN == "synthetic" or dataset in USER_DATASETS:
        return []
    return [f"resources/medmnist/{dataset}_{size}.npz.verified"]


def domain_npz(dataset, size, domain):
    """A domain with no corruption steps is the base file itself (no copy)."""
    if not config["domains"][domain]:
        return base_npz(dataset, size)
    origin = "user" if dataset in USER_DATASETS else ORIGIN
    return f"resources/domains/{origin}/{dataset}_{size}/{domain}.npz"


def domain_sources(study, dataset, setting):
    """Domain name -> npz path for a ``domain`` setting (its clients' data)."""
    s = config["studies"][study]["settings"][setting]
    return {d: domain_npz(dataset, study_size(study), d) for d in s["params"]["domains"]}


def setting_sources(study, dataset, setting):
    """Data source name -> npz path for a setting (``base`` and/or one per domain; ``partition.source_names``).

    A ``domain`` setting with ``holdout: official`` (the default) also reads ``base``: its global
    test set is the official test split without domain shift."""
    s = config["studies"][study]["settings"][setting]
    size = study_size(study)
    return {name: base_npz(dataset, size) if name == "base" else domain_npz(dataset, size, name)
            for name in PARTITION.source_names(s["scheme"], s.get("params") or {})}


def setting_datasets(study, setting):
    return GRID.setting_datasets(config["studies"][study], setting)


def runs(study):
    for r in GRID.runs(config["studies"][study]):
        yield dict(study=study, **r)


def run_dir(w):
    return f"results/{w['study']}/{w['dataset']}/{w['setting']}/{w['method']}/seed{w['seed']}"


def partition_json(w):
    return f"resources/partitions/{w['study']}/{w['dataset']}/{w['setting']}/seed{w['seed']}.json"


def early_stopping_spec(es):
    """Only what changes training: tau/patience matter to a run only when it stops itself."""
    if es["mode"] == "none":
        return {"mode": "none"}
    return {"mode": es["mode"], "tau": es["tau"], "patience": es["patience"], "counting": es["counting"]}


def run_spec(wildcards):
    """The resolved per-run parameters (a fedmedbench RunSpec as a dict, result-changing fields only:
    threads and log_every come from the job and config, see fedmedbench.fl.spec.for_job)."""
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
        "model": run_model(w["study"], w["method"])["name"],
        "pretrained_path": run_weights(w["study"], w["method"])[0],
        "train": GRID.run_train(st, w["setting"], w["method"]),
        "clients_per_round": st["clients_per_round"],
        "method_params": method_params.resolve(w["method"], st["method_params"], st["settings"][w["setting"]]),
        "device": config["device"],
        "data_origin": dataset_origin(w["dataset"], st["size"]),
        "eval_every": st["eval_every"],
        "early_stopping": early_stopping_spec(st["early_stopping"]),
        "save_client_models": st["save_client_models"],
        "client_models_round": st["client_models_round"],
        # only when on: other studies' params (and run hashes) stay as they were
        **({"client_validation": st["client_validation"]} if st["client_validation"] else {}),
    }


def run_model(study, method):
    """The model block of one method: the study's, with the method's override (method_model) on top."""
    return GRID.run_model(config["studies"][study], method)


def run_weights(study, method):
    """(weight file, manifests) of a method's model block (rules/weights.smk)."""
    key = f"studies.{study}.method_model.{method}" if method in config["studies"][study]["method_model"] else f"studies.{study}.model"
    return model_weights(run_model(study, method), key)


def study_summaries(wildcards):
    return [f"{run_dir(r)}/summary.json" for r in runs(wildcards.study)]


def study_metrics(wildcards):
    return [f"{run_dir(r)}/metrics.csv" for r in runs(wildcards.study)]


def all_targets():
    out = []
    for study in config["studies"]:
        out += expand("results/{study}/tables/final_metrics{tag}.{ext}", study=study, tag=TAG, ext=["csv", "md", "tex"])
        out.append(f"results/{study}/figures/convergence{TAG}.png")
        out += earlystop_targets(study)
        out += gpaf_targets(study)
    return out


def corrupt_input(wildcards):
    """The base file a domain is corrupted from (by the origin wildcard)."""
    if wildcards.origin == "user":
        return f"resources/user/{wildcards.dataset}_{wildcards.size}.npz"
    if wildcards.origin == "synthetic":
        return f"resources/synthetic/{wildcards.dataset}_{wildcards.size}.npz"
    return f"resources/medmnist/{wildcards.dataset}_{wildcards.size}.npz"


def es_taus(study):
    """Every tau the early-stopping report evaluates (sweep, study tau, Table 2 tau)."""
    return ES.taus(config["studies"][study])


def paper_values_input(study):
    """The study's typed-in paper values (config/paper_values/<study>.yaml), when there are any."""
    path = f"config/paper_values/{study}.yaml"
    return [path] if os.path.isfile(os.path.join(workflow.basedir, path)) else []


def es_figure_setting(study):
    return ES.figure_setting(config["studies"][study])


def earlystop_targets(study):
    return ES.targets(study, config["studies"][study], TAG)


# --- surgical video data layer (rules/surgical.smk; docs/surgical_data.md) ---------------------
SURGICAL = config["surgical"]
SORIGIN = SURGICAL["origin"]
#: file-name tag of surgical figures built from synthetic data
STAG = "_synthetic" if SORIGIN == "synthetic" else ""
SURG = f"resources/surgical/{SORIGIN}"
SYNTH_RAW = "resources/surgical/synthetic/raw"


def surgical_used_datasets():
    """Datasets the groups and sites need (only these are indexed)."""
    used = []
    for g in SURGICAL["groups"].values():
        used += g["datasets"]
    used += [s["dataset"] for s in SURGICAL["sites"].values()]
    return sorted(set(used))


def _check_surgical_config():
    datasets, groups = SURGICAL["datasets"], SURGICAL["groups"]
    for name in surgical_used_datasets():
        if name not in datasets:
            _config_error("surgical.datasets", f"'{name}' is used by a group or site but not defined (defined: {sorted(datasets)})")
        if SORIGIN == "synthetic" and name not in SURGICAL["synthetic"]["datasets"]:
            _config_error("surgical.synthetic.datasets", f"no synthetic spec for '{name}' (surgical.origin is synthetic)")
    if SORIGIN == "real" and surgical_used_datasets() and not SURGICAL["root"]:
        _config_error("surgical.root", "surgical.origin is real: set the folder holding the licensed datasets (docs/surgical_data.md)")
    for gname, g in groups.items():
        key = f"surgical.groups.{gname}"
        n = g["num_clients"]
        for field in ("exclude_videos", "frame_step", "video_splits"):
            for d in g[field]:
                if d not in g["datasets"]:
                    _config_error(f"{key}.{field}", f"'{d}' is not one of the group's datasets {g['datasets']}")
        if g["eval_sources"] is not None:
            if len(g["eval_sources"]) != n:
                _config_error(f"{key}.eval_sources", f"needs one entry per client ({n})")
            for src in g["eval_sources"]:
                for d in src:
                    if d not in g["datasets"]:
                        _config_error(f"{key}.eval_sources", f"'{d}' is not one of the group's datasets {g['datasets']}")
        if g["pool_from"] is not None and g["settings"].get(g["pool_from"], {}).get("scheme") != "curation":
            _config_error(f"{key}.pool_from", f"'{g['pool_from']}' is not a curation setting of the group")
        for sname, s in g["settings"].items():
            skey = f"{key}.settings.{sname}"
            if s["scheme"] == "curation" and len(s.get("sources") or g["eval_sources"] or []) != n:
                _config_error(f"{skey}.sources", f"curation needs one list of datasets per client ({n}) in sources or eval_sources")
            if s["scheme"] == "lmo":
                base = g["settings"].get(s["base"])
                if base is None or base["scheme"] == "lmo":
                    _config_error(f"{skey}.base", f"'{s['base']}' must be a non-lmo setting of the group")
                if len(s["client_classes"]) != n:
                    _config_error(f"{skey}.client_classes", f"needs one entry per client ({n})")
                for item in s["client_classes"]:
                    if isinstance(item, str) and item != "all" and item not in SURGICAL["tool_groups"]:
                        _config_error(f"{skey}.client_classes", f"'{item}' is neither 'all' nor a surgical.tool_groups name {sorted(SURGICAL['tool_groups'])}")


_check_surgical_config()


def surgical_dataset_cfg(name):
    """A dataset's config with its bad-file policy resolved (per-dataset override, else surgical.bad_files)."""
    cfg = dict(SURGICAL["datasets"][name])
    cfg["bad_files"] = cfg.get("bad_files") or SURGICAL["bad_files"]
    return cfg


def surgical_root():
    return SYNTH_RAW if SORIGIN == "synthetic" else SURGICAL["root"]


def surgical_raw_input(wildcards):
    """Synthetic: the generated folder. Real: none (the index script names a missing folder)."""
    if SORIGIN == "synthetic":
        return f"{SYNTH_RAW}/{SURGICAL['datasets'][wildcards.sdataset]['folder']}"
    return []


def surgical_synthetic_outputs():
    """The folders synthesize_surgical writes: one per synthetic dataset, in its release layout."""
    names = sorted(SURGICAL["synthetic"]["datasets"])
    return [directory(f"{SYNTH_RAW}/{SURGICAL['datasets'][n]['folder']}") for n in names if n in SURGICAL["datasets"]]


def surgical_synthetic_params():
    names = sorted(SURGICAL["synthetic"]["datasets"])
    return {"synthetic": SURGICAL["synthetic"], "datasets": {n: SURGICAL["datasets"][n] for n in names if n in SURGICAL["datasets"]}}


def surgical_index(name):
    return f"{SURG}/index/{name}"


def surgical_group_indices(wildcards):
    return {d: surgical_index(d) for d in SURGICAL["groups"][wildcards.sgroup]["datasets"]}


def surgical_site_indices():
    return {d: surgical_index(d) for d in sorted({s["dataset"] for s in SURGICAL["sites"].values()})}


def surgical_targets():
    """Every surgical output the config asks for (added to rule all)."""
    out = []
    for g in SURGICAL["groups"]:
        out += [f"{SURG}/groups/{g}", f"{SURG}/yolo/{g}"]
    if SURGICAL["sites"]:
        out.append(f"{SURG}/clips")
    return out
# --- GPAF study report (rules/report_gpaf.smk; targets and checks: fedmedbench.studies.gpaf.runs) --


def gpaf_targets(study):
    return GPAF.targets(study, config["studies"][study], list(runs(study)), lambda setting: setting_datasets(study, setting), TAG)


def gpaf_dataset_summaries(wildcards):
    return [f"{run_dir(r)}/summary.json" for r in runs(wildcards.study) if r["dataset"] == wildcards.dataset]


def _gpaf_tsne_runs(wildcards):
    return GPAF.tsne_runs(wildcards.study, config["studies"][wildcards.study], wildcards.dataset, wildcards.setting)


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


# --- HTML report (rules/report_html.smk) --------------------------------------------------------
def report_origin(study):
    """Data origin shown in a caption: MedMNIST studies by their datasets, surgical studies by surgical.origin."""
    return study_origin(study) if study in config["studies"] else SORIGIN


def report_html_targets():
    """One HTML page (results/<study>/report/<table>.html) per Markdown table that rule all builds."""
    out = []
    for t in [*all_targets(), *ultraflwr_targets(), *fedst_targets()]:
        p = Path(t)
        if p.suffix == ".md" and p.parent.name == "tables":
            out.append(str(p.parent.parent / "report" / f"{p.stem}.html"))
    return out
